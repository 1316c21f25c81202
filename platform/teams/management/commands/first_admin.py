"""`python manage.py first_admin USERNAME --email ADDRESS --team NAME`: the first site
admin of a fresh site (a Django superuser) and their team, with them as its admin.

The login a site reachable by others starts from (`up` makes the public demo login on
loopback only). It asks for the password twice, or reads ROLLWAY_ADMIN_PASSWORD with
--no-input (scripts, containers); Django's password validators apply.

Idempotent for its own admin: run again with the same username it changes nothing
(and makes the team, with them as its admin, if that is missing). It refuses when the
site has another admin already: from then on people and teams are made on /teams/,
with the API or with `rollway team`.
"""

from __future__ import annotations

import getpass
import os

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils.text import slugify

from teams import actions
from teams.models import Membership, Team

PASSWORD_ENV = "ROLLWAY_ADMIN_PASSWORD"


class Command(BaseCommand):
    help = "Make the site's first admin (a superuser) and their team; refuses when a site admin exists."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username", help="the admin's login")
        parser.add_argument("--email", default="", help="the admin's email address (for password resets)")
        parser.add_argument("--team", default="Lab", help='the team they administer (default "Lab")')
        parser.add_argument(
            "--no-input",
            action="store_true",
            help=f"ask nothing: the password comes from ${PASSWORD_ENV}",
        )

    def handle(self, *args, username: str, email: str, team: str, no_input: bool, **opts) -> None:
        users = get_user_model().objects
        others = users.filter(is_superuser=True, is_active=True).exclude(username=username)
        existing = users.filter(username=username).first()
        if existing is not None and not existing.is_superuser:
            raise CommandError(f"user {username!r} exists and is not a site admin: choose another username")
        if existing is None and others.exists():
            names = ", ".join(sorted(others.values_list("username", flat=True)[:3]))
            raise CommandError(
                f"this site has an admin already ({names}): they create teams and add people on /teams/ "
                "(or with `rollway team create`)"
            )
        slug = slugify(team)
        if not slug:
            raise CommandError(f"--team {team!r} gives no slug: use letters or digits")
        with transaction.atomic():
            admin = existing or self._create(username, email, no_input)
            found = Team.objects.filter(slug=slug).first()
            if found is None:
                found = actions.do_create_team(admin, team, slug, admin)
            else:  # the team exists already (made by hand): they become its admin
                actions.do_set_member(admin, found, admin.username, Membership.Role.ADMIN)
        state = "was already" if existing else "is now"
        self.stdout.write(
            f"{admin.username} {state} a site admin and the admin of team {found.name} ({found.slug}); "
            "log in at /accounts/login/, then add people and teams on /teams/"
        )

    def _create(self, username: str, email: str, no_input: bool):
        if no_input:
            password = os.environ.get(PASSWORD_ENV, "")
            if not password:
                raise CommandError(f"--no-input reads the password from ${PASSWORD_ENV}, which is empty")
        else:
            password = getpass.getpass(f"Password for {username}: ")
            if getpass.getpass("Password (again): ") != password:
                raise CommandError("the two passwords differ")
        user = get_user_model()(username=username, email=email)
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("password: " + " ".join(exc.messages)) from None
        return get_user_model().objects.create_superuser(username=username, email=email, password=password)
