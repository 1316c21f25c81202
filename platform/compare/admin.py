"""Comparisons in the Django admin, with the action "Launch again". Staff who are not
superusers see only their own teams' comparisons, as with saved configurations."""

from __future__ import annotations

from django.contrib import admin, messages

from compare import actions
from compare.models import Comparison, ComparisonRun
from foundation.errors import ActionError
from teams.admin import administered


class ComparisonRunInline(admin.TabularInline):
    model = ComparisonRun
    fields = ["run", "configuration"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Comparison)
class ComparisonAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "created_by", "created_at"]
    list_filter = ["team"]
    search_fields = ["name", "description"]
    readonly_fields = ["team", "experiment", "configurations", "seeds", "overrides", "created_by", "created_at"]
    inlines = [ComparisonRunInline]
    actions = ["launch_again"]

    def get_queryset(self, request):
        found = super().get_queryset(request).select_related("team", "created_by")
        return found if request.user.is_superuser else found.filter(team__in=administered(request.user))

    def has_add_permission(self, request):
        # A comparison is made by launching it (the form or the API), which checks it.
        return False

    @admin.action(description="Launch again (adds runs with the same seeds)")
    def launch_again(self, request, queryset):
        for comparison in queryset:
            try:
                rerun = actions.check_rerun(request.user, comparison)
            except ActionError as exc:
                self.message_user(request, f"{comparison.name}: nothing launched: {exc.message}", messages.ERROR)
                continue
            runs = actions.do_rerun_comparison(request.user, comparison, rerun)
            self.message_user(request, f"{comparison.name}: queued {len(runs)} more runs.", messages.SUCCESS)
