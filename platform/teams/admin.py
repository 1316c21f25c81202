"""The Django admin: a superuser sees everything; any other staff user only the objects
of the teams they are an admin of (`TeamScopedAdmin`), so the admin is no way around
the roles the site enforces."""

from django.contrib import admin

from teams.models import AuditEvent, Membership, Team


def administered(user):
    """The teams `user` may manage in the admin: all for a superuser, else those whose
    admin they are."""
    if user.is_superuser:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user, memberships__role=Membership.Role.ADMIN)


class TeamScopedAdmin(admin.ModelAdmin):
    """A model admin whose rows belong to a team through `team_path` (a lookup path)."""

    team_path = "team"

    def get_queryset(self, request):
        found = super().get_queryset(request)
        if request.user.is_superuser:
            return found
        return found.filter(**{f"{self.team_path}__in": administered(request.user)}).distinct()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "team" and not request.user.is_superuser:
            kwargs["queryset"] = administered(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(TeamScopedAdmin):
    team_path = "pk"
    list_display = ["name", "slug", "max_queued_runs", "max_running_runs", "max_gpus", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]
    fieldsets = [
        (None, {"fields": ["name", "slug"]}),
        (
            "Quotas (teams/quotas.py; empty: the site's default)",
            {"fields": ["max_queued_runs", "max_running_runs", "max_gpus"]},
        ),
    ]
    QUOTA_FIELDS = ("max_queued_runs", "max_running_runs", "max_gpus")

    def has_add_permission(self, request):
        return request.user.is_superuser  # a new team has no admin yet: the site's own call

    def get_readonly_fields(self, request, obj=None):
        # A team's share of the site is the site's call: a team admin sees it, only a
        # superuser changes it.
        found = list(super().get_readonly_fields(request, obj))
        return found if request.user.is_superuser else [*found, *self.QUOTA_FIELDS]


@admin.register(Membership)
class MembershipAdmin(TeamScopedAdmin):
    list_display = ["user", "team", "role", "joined_at"]
    list_filter = ["role", "team"]
    autocomplete_fields = ["user", "team"]


@admin.register(AuditEvent)
class AuditEventAdmin(TeamScopedAdmin):
    list_display = ["at", "team", "actor_name", "action", "subject"]
    list_filter = ["action", "team"]
    search_fields = ["actor_name", "subject"]

    # The log is a record: nobody edits or deletes it here.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
