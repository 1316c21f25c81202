from django.contrib import admin

from runs.models import Experiment, MetricPoint, Run
from teams.admin import TeamScopedAdmin


@admin.register(Experiment)
class ExperimentAdmin(TeamScopedAdmin):
    list_display = ["name", "team", "created_by", "created_at"]
    list_filter = ["team"]
    search_fields = ["name", "description"]
    autocomplete_fields = ["team"]


@admin.register(Run)
class RunAdmin(TeamScopedAdmin):
    team_path = "experiment__team"
    list_display = ["id", "name", "experiment", "preset", "status", "launched_by", "created_at"]
    list_filter = ["status", "preset", "experiment__team"]
    search_fields = ["name", "error"]
    readonly_fields = [
        "created_at",
        "launched_at",
        "started_at",
        "finished_at",
        "celery_task_id",
        "ray_actor",
        # The engine's record of a failure, and its traceback: only here, for admins.
        "failure",
        "error_traceback",
    ]
    raw_id_fields = ["experiment", "launched_by"]


@admin.register(MetricPoint)
class MetricPointAdmin(TeamScopedAdmin):
    team_path = "run__experiment__team"
    list_display = ["run", "series", "step", "value", "time"]
    list_filter = ["series"]
    raw_id_fields = ["run"]
    # Millions of rows: never count them for the changelist paginator.
    show_full_result_count = False
