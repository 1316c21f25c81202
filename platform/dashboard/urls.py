from django.urls import path

from dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.runs, name="runs"),
    # The list at the path its runs' pages sit under too: /runs/<id>/ has a /runs/ above it.
    path("runs/", views.runs, name="runs-list"),
    path("runs/new/", views.launch, name="launch"),
    path("runs/cancel/", views.cancel_many, name="cancel-many"),
    path("runs/<int:run_id>/", views.run, name="run"),
    path("runs/<int:run_id>/log/", views.run_log, name="run-log"),
    path("runs/<int:run_id>/cancel/", views.cancel, name="cancel"),
    path("runs/<int:run_id>/retry/", views.retry, name="retry"),
    path("runs/<int:run_id>/replay/", views.replay, name="replay"),
    path("runs/<int:run_id>/resume/", views.resume, name="resume"),
    path("runs/<int:run_id>/notes/", views.annotate, name="notes"),
    path("runs/<int:run_id>/plan/<int:row>/", views.plan_row, name="plan-row"),
]
