from django.contrib import admin
from django.urls import include, path

from api.views import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("rollway.accounts")),
    path("", include("compare.urls")),  # /compare/ and /api/compare
    path("api/", include("api.urls")),
    path("healthz", healthz, name="healthz"),
    path("configs/", include("configs.urls")),
    path("teams/", include("teams.urls")),
    path("", include("dashboard.urls")),
]

# A database outage met outside any view (a middleware's query) is a 503 too (foundation/dbdown.py).
handler500 = "foundation.dbdown.server_error"
