"""Password reset by mail, only where the site can send mail (EMAIL_HOST set)."""

from __future__ import annotations

import pytest
from django.core import mail

RESET_PAGES = ["/accounts/password_reset/", "/accounts/password_reset/done/", "/accounts/reset/done/"]


@pytest.mark.parametrize("page", RESET_PAGES)
def test_without_mail_settings_the_reset_pages_say_reset_is_off(client, db, settings, page):
    settings.EMAIL_HOST = ""
    r = client.get(page)
    assert r.status_code == 404
    assert "Password reset is off" in r.content.decode() and "EMAIL_HOST" in r.content.decode()


def test_without_mail_settings_a_reset_request_sends_nothing(client, owner, settings):
    settings.EMAIL_HOST = ""
    owner.email = "olga@example.com"
    owner.save()
    r = client.post("/accounts/password_reset/", {"email": "olga@example.com"})
    assert r.status_code == 404 and mail.outbox == []


def test_with_mail_settings_a_reset_request_mails_the_link(client, owner, settings):
    settings.EMAIL_HOST = "smtp.example.com"  # pytest-django keeps the mail in mail.outbox
    owner.email = "olga@example.com"
    owner.save()
    assert client.get("/accounts/password_reset/").status_code == 200
    r = client.post("/accounts/password_reset/", {"email": "olga@example.com"})
    assert r.status_code == 302 and r["Location"] == "/accounts/password_reset/done/"
    [sent] = mail.outbox
    assert sent.to == ["olga@example.com"] and "/accounts/reset/" in sent.body


def test_logging_in_needs_no_mail_settings(client, owner, settings):
    settings.EMAIL_HOST = ""
    r = client.post("/accounts/login/", {"username": "olga", "password": "pw-olga"})
    assert r.status_code == 302
