"""Teams own experiments; a user sees and acts on the runs of the teams they belong to,
as far as their role in the team allows (teams/roles.py says what each role may do)."""

from __future__ import annotations

from typing import Self

from django.conf import settings
from django.db import models
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils.text import slugify


class TeamQuerySet(models.QuerySet):
    def for_user(self, user) -> TeamQuerySet:
        """Teams `user` belongs to (none for an anonymous user)."""
        if not user.is_authenticated:
            return self.none()
        found = self.filter(memberships__user=user)
        scope = getattr(user, "token_scope", None)  # a personal API token's one team
        return found.filter(pk=scope[0]) if scope is not None else found

    def ensure_demo(self, user, name: str = "Demo") -> Team:
        """The demo team, created if missing, with `user` as its owner. Idempotent."""
        team, _ = self.get_or_create(slug=slugify(name), defaults={"name": name})
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": Membership.Role.ADMIN})
        return team


class TeamOwnedQuerySet(models.QuerySet):
    """Rows that belong to a team, through the lookup path `team_path`: each is visible
    to the team's members and to no one else (teams/roles.py says what they may do)."""

    team_path = "team"

    def visible_to(self, user) -> Self:
        """The rows of the teams `user` belongs to (none for an anonymous user)."""
        if not user.is_authenticated:
            return self.none()
        return self.filter(**{f"{self.team_path}__in": Team.objects.for_user(user)})


class Team(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The team's own share of the site (teams/quotas.py), set by a site admin; empty: the
    # site's default from settings.
    max_queued_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Runs the team may have waiting in the queue. Empty: ROLLWAY_TEAM_MAX_QUEUED."
    )
    max_running_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Runs the team may have active at once. Empty: ROLLWAY_MAX_RUNNING_PER_TEAM."
    )
    max_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPUs the team's active runs may hold together. Empty: ROLLWAY_TEAM_MAX_GPUS."
    )
    # When the run queue last scheduled one of the team's runs: of two teams with as many
    # runs active, the one served longer ago takes the next slot (runs/models.py `queue_order`).
    queue_served_at = models.DateTimeField(null=True, blank=True, editable=False)

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
        # Ordered from least to most (teams/roles.py ranks them): a viewer reads, a member
        # also launches and cancels their own runs, an admin does everything in the team,
        # members and roles included.
        VIEWER = "viewer", "Viewer"
        MEMBER = "member", "Member"
        ADMIN = "admin", "Admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="unique_team_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class AuditEvent(models.Model):
    """Who did what in a team, and when: launches, cancels, exports, comparisons and
    changes to the team's members. Written by the actions layer (teams/audit.py) in the
    same transaction as the change itself, so an event exists exactly when its change
    does. `subject` names what it was done to ("run 12", "user tom"); the actor is kept
    by name too, so the log outlives a deleted account."""

    class Action(models.TextChoices):
        LAUNCH = "launch", "launched"
        CANCEL = "cancel", "cancelled"
        EXPORT = "export", "exported"
        COMPARE = "compare", "launched comparison"
        RERUN = "rerun", "re-ran comparison"
        RETRY = "retry", "retried"
        RESUME = "resume", "resumed"
        CLONE = "clone", "cloned"
        REPLAY = "replay", "replayed"
        NOTES = "notes", "edited notes and tags of"
        MEMBER_ADD = "member_add", "added member"
        MEMBER_ROLE = "member_role", "changed role"
        MEMBER_REMOVE = "member_remove", "removed member"
        TEAM_CREATE = "team_create", "created team"

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="audit_events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=20, choices=Action.choices)
    subject = models.CharField(max_length=200)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["team", "-at"], name="audit_team_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.get_action_display()} {self.subject}"


class ApiToken(models.Model):
    """A personal API token: a script acts as its owner, in one team, with a role no
    higher than the owner's (teams/tokens.py makes, checks and revokes them).

    Only a hash of the secret is stored: the secret is shown once, when it is made.
    SHA-256 suffices (no slow hash): the secret is 256 random bits, not a password a
    person chose."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    role = models.CharField(max_length=10, choices=Membership.Role.choices)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, help_text="The secret's first characters, to tell tokens apart.")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.user} in {self.team} as {self.role})"

    def as_dict(self) -> dict:
        return {
            "id": self.pk,
            "name": self.name,
            "team": self.team.slug,
            "role": self.role,
            "prefix": self.prefix,
            "created_at": self.created_at.isoformat(),
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


@receiver(post_delete, sender=Membership)
def drop_tokens_of_removed_member(sender, instance: Membership, **kwargs) -> None:
    """A token acts as its maker in one team, so once the maker leaves that team it can
    never authenticate again; kept, it would still name the team they left in their token
    list. A signal rather than the actions layer, so a removal from the admin counts too."""
    ApiToken.objects.filter(user_id=instance.user_id, team_id=instance.team_id).delete()
