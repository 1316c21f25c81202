from django.urls import path

from compare import views

app_name = "compare"

urlpatterns = [
    path("compare/", views.page, name="page"),
    path("api/compare", views.api, name="api"),
]
