from django.urls import path

from api import checkpoints, comparisons, configs, teams, tokens, views

app_name = "api"

urlpatterns = [
    path("presets", views.presets, name="presets"),
    path("configs", configs.configs, name="configs"),
    path("configs/<str:config_id>", configs.config_detail, name="config"),
    path("configs/<str:config_id>/versions", configs.config_versions, name="config-versions"),
    path("comparisons", comparisons.comparisons, name="comparisons"),
    path("comparisons/<int:comparison_id>", comparisons.comparison_detail, name="comparison"),
    path("comparisons/<int:comparison_id>/rerun", comparisons.comparison_rerun, name="comparison-rerun"),
    path("config/schema", views.config_schema, name="config-schema"),
    path("teams", views.teams, name="teams"),
    path("tokens", tokens.tokens_view, name="tokens"),
    path("tokens/<str:token_id>", tokens.token_view, name="token"),
    path("teams/<str:team>/members", teams.members, name="team-members"),
    path("teams/<str:team>/members/<str:username>", teams.member, name="team-member"),
    path("teams/<str:team>/audit", teams.audit, name="team-audit"),
    path("experiments", views.experiments, name="experiments"),
    path("runs", views.runs, name="runs"),
    path("runs/cancel", views.runs_cancel, name="runs-cancel"),
    path("runs/<int:run_id>", views.run_detail, name="run"),
    path("runs/<int:run_id>/cancel", views.run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/metrics", views.run_metrics, name="run-metrics"),
    path("runs/<int:run_id>/status", views.run_status, name="run-status"),
    path("runs/<int:run_id>/export", views.run_export, name="run-export"),
    path("runs/<int:run_id>/checkpoints", checkpoints.run_checkpoints, name="run-checkpoints"),
]
