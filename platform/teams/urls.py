from django.urls import path

from teams import views

app_name = "teams"

urlpatterns = [
    path("", views.teams, name="list"),
    path("<slug:slug>/members/", views.members, name="members"),
]
