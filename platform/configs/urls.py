from django.urls import path

from configs import views

app_name = "configs"

urlpatterns = [
    path("", views.configs, name="list"),
]
