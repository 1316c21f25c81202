from django.urls import path

from teams import views

app_name = "teams"

urlpatterns = [
    path("", views.teams, name="list"),
    path("new/", views.new_team, name="new-team"),
    path("tokens/", views.new_token, name="new-token"),
    path("tokens/<int:token_id>/revoke/", views.revoke_token, name="revoke-token"),
    path("<slug:slug>/members/", views.members, name="members"),
]
