from django.urls import path

from dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.runs, name="runs"),
    path("runs/new/", views.launch, name="launch"),
    path("runs/cancel/", views.cancel_many, name="cancel-many"),
    path("runs/<int:run_id>/", views.run, name="run"),
    path("runs/<int:run_id>/cancel/", views.cancel, name="cancel"),
]
