"""The accounts pages (django.contrib.auth's): log in and out, change a password, and
reset a forgotten one by mail. A site with no mail server (EMAIL_HOST unset) cannot send
the reset link: its reset pages answer 404 with a page that says reset is off and what
to do instead, rather than a form that pretends to send mail."""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth import urls as auth_urls
from django.http import HttpRequest
from django.shortcuts import render
from django.urls import path

RESET_NAMES = ("password_reset", "password_reset_done", "password_reset_confirm", "password_reset_complete")


def sends_mail() -> bool:
    return bool(settings.EMAIL_HOST)


def needs_mail(view):
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not sends_mail():
            return render(request, "registration/password_reset_off.html", status=404)
        return view(request, *args, **kwargs)

    return wrapper


urlpatterns = [
    path(str(p.pattern), needs_mail(p.callback), name=p.name) if p.name in RESET_NAMES else p
    for p in auth_urls.urlpatterns
]
