from django.urls import path

from compare import views

app_name = "compare"

urlpatterns = [
    path("compare/", views.page, name="page"),
    path("api/compare", views.api, name="api"),
    path("comparisons/", views.comparisons, name="comparisons"),
    path("comparisons/new/", views.comparison_new, name="comparison-new"),
    path("comparisons/<int:comparison_id>/", views.comparison, name="comparison"),
    path("comparisons/<int:comparison_id>/rerun/", views.comparison_rerun, name="comparison-rerun"),
    path("comparisons/<int:comparison_id>/league/", views.comparison_league, name="comparison-league"),
    path(
        "comparisons/<int:comparison_id>/league/simulate/",
        views.comparison_league_simulate,
        name="comparison-league-simulate",
    ),
]
