from django.urls import path

from api import ingest
from api.api import api
from api.comparisons import COMPARE_URL_NAME

app_name = "api"

# The engine's ingest: plain Django views authenticated by the run's own bearer token
# (api/ingest.py), never a user, so neither the API's auth nor CSRF applies. The
# metrics POST is routed by the API (api/views.py): its URL is the metrics read's too.
ingest_urlpatterns = [
    path("runs/<int:run_id>/status", ingest.status_view, name="run-status"),
    path("runs/<int:run_id>/placement", ingest.placement_view, name="run-placement"),
    path("runs/<int:run_id>/schedule", ingest.schedule_view, name="run-schedule"),
]

# Ninja's URLs (the operations, /api/openapi.json, /api/docs), less its root view: /api/
# itself stays the site's plain 404; and less /api/compare, which compare/urls.py routes.
api_urlpatterns = [p for p in api.urls[0] if p.name not in ("api-root", COMPARE_URL_NAME)]

urlpatterns = ingest_urlpatterns + api_urlpatterns
