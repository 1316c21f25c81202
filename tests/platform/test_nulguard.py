"""A NUL in a query parameter is a 400 naming it, on every route (the admin's included)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url, field",
    [
        ("/admin/runs/run/?status__exact=%00", "status__exact"),
        ("/admin/autocomplete/?term=%00&app_label=runs&model_name=run&field_name=experiment", "term"),
        ("/api/runs?q=a%00b", "q"),
    ],
)
def test_a_nul_in_a_query_parameter_is_a_400_naming_it(client, url, field):
    admin = get_user_model().objects.create_superuser("root", password="pw-root")
    client.force_login(admin)
    response = client.get(url)
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_a_query_without_nul_goes_through(client):
    admin = get_user_model().objects.create_superuser("root", password="pw-root")
    client.force_login(admin)
    assert client.get("/admin/runs/run/?status__exact=running").status_code == 200
