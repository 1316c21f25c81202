"""Teams own experiments; a user sees and acts on the runs of the teams they belong to."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.text import slugify


class TeamQuerySet(models.QuerySet):
    def for_user(self, user) -> TeamQuerySet:
        """Teams `user` belongs to (none for an anonymous user)."""
        if not user.is_authenticated:
            return self.none()
        return self.filter(memberships__user=user)

    def ensure_demo(self, user, name: str = "Demo") -> Team:
        """The demo team, created if missing, with `user` as its owner. Idempotent."""
        team, _ = self.get_or_create(slug=slugify(name), defaults={"name": name})
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": Membership.Role.OWNER})
        return team


class Team(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        if not self.slug:
            self.slug = slugify(self.name)
        super().save(*args, **kwargs)

    def has_member(self, user) -> bool:
        if not user.is_authenticated:
            return False
        return self.memberships.filter(user=user).exists()

    def role_of(self, user) -> str | None:
        """The user's role in this team, or None for an outsider."""
        if not user.is_authenticated:
            return None
        return self.memberships.filter(user=user).values_list("role", flat=True).first()


class Membership(models.Model):
    class Role(models.TextChoices):
        # Owners manage the team (members, deletion); every member launches and cancels runs.
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="unique_team_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"
