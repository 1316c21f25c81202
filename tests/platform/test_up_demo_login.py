"""`manage.py up`'s demo login (password `demo`, printed in the README) exists only on a
site nobody else can reach, unless `--demo` asks; a start without it locks an earlier one."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from ops.management.commands.up import (
    DEMO_PASSWORD,
    DEMO_USERNAME,
    Command,
    is_loopback,
    settle_demo_login,
    wants_demo,
)


def demo_can_log_in() -> bool:
    user = get_user_model().objects.filter(username=DEMO_USERNAME).first()
    return user is not None and user.is_active and user.check_password(DEMO_PASSWORD)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_addresses_are_recognised(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.4", "10.0.0.1", "rollway.example.org"])
def test_other_addresses_are_not_loopback(host):
    assert not is_loopback(host)


@pytest.mark.parametrize(
    "host, demo, no_demo, expected",
    [
        ("127.0.0.1", False, False, True),  # make run: the demo login, as before
        ("127.0.0.1", False, True, False),
        ("0.0.0.0", False, False, False),  # the open bind: no public password by default
        ("0.0.0.0", True, False, True),  # unless asked for
        ("192.168.1.4", False, True, False),
    ],
)
def test_it_makes_the_demo_login_only_on_loopback_unless_asked(host, demo, no_demo, expected):
    assert wants_demo(host, demo, no_demo) is expected


def test_demo_and_no_demo_cannot_both_be_given():
    parser = Command().create_parser("manage.py", "up")
    assert parser.parse_args(["--host", "0.0.0.0", "--demo"]).demo
    with pytest.raises(CommandError, match="not allowed with"):
        parser.parse_args(["--demo", "--no-demo"])


@pytest.mark.django_db
def test_a_loopback_start_makes_a_working_demo_login():
    works, notes = settle_demo_login("127.0.0.1", demo=False, no_demo=False)
    assert works and notes == []
    assert demo_can_log_in()


@pytest.mark.django_db
def test_an_open_start_locks_the_demo_login_an_earlier_loopback_start_made():
    settle_demo_login("127.0.0.1", demo=False, no_demo=False)
    assert demo_can_log_in()

    works, notes = settle_demo_login("0.0.0.0", demo=False, no_demo=False)

    assert not works
    assert not demo_can_log_in()
    user = get_user_model().objects.get(username=DEMO_USERNAME)
    assert not user.has_usable_password()  # the row stays: its team and runs keep their owner
    assert any("can no longer log in" in n for n in notes), notes
    assert any("0.0.0.0" in n and "manage.py first_admin" in n for n in notes), notes


@pytest.mark.django_db
def test_an_open_start_without_a_demo_user_creates_none():
    works, notes = settle_demo_login("0.0.0.0", demo=False, no_demo=False)
    assert not works
    assert not get_user_model().objects.filter(username=DEMO_USERNAME).exists()
    assert not any("can no longer log in" in n for n in notes)


@pytest.mark.django_db
def test_an_open_start_that_asks_for_the_demo_gets_it_and_a_warning():
    settle_demo_login("0.0.0.0", demo=False, no_demo=False)
    works, notes = settle_demo_login("0.0.0.0", demo=True, no_demo=False)
    assert works and demo_can_log_in()
    assert any("open to anyone" in n for n in notes), notes
