"""WebSocket consumers through the real ASGI stack (origin check, session auth, routing).

Each test drives a WebsocketCommunicator inside asyncio.run; consumers read the DB from
another thread, hence transactional_db.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from runs import events
from runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1:8000")


def communicator(path: str, user=None, origin=ORIGIN) -> WebsocketCommunicator:
    from rollway.asgi import application

    headers = [origin] if origin else []
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def closed_with(comm: WebsocketCommunicator) -> int | None:
    """Connect; return the close code the server sent right after accepting (or None)."""
    connected, _ = await comm.connect()
    assert connected, "refusals are sent as close codes after accepting"
    message = await comm.receive_output(timeout=2)
    await comm.wait()
    return message.get("code") if message["type"] == "websocket.close" else None


@pytest.mark.parametrize("path", ["/ws/runs/", "/ws/runs/{id}/"])
def test_an_anonymous_client_is_refused_with_4401(run, path):
    comm = communicator(path.format(id=run.pk))
    assert asyncio.run(closed_with(comm)) == 4401


def test_an_outsider_is_refused_a_runs_stream_with_4403(run, outsider):
    comm = communicator(f"/ws/runs/{run.pk}/", outsider)
    assert asyncio.run(closed_with(comm)) == 4403


def test_a_missing_run_looks_the_same_as_a_forbidden_one(owner, db):
    comm = communicator("/ws/runs/99999/", owner)
    assert asyncio.run(closed_with(comm)) == 4403


def test_a_foreign_origin_is_rejected_at_the_handshake(run, owner):
    comm = communicator(f"/ws/runs/{run.pk}/", owner, origin=(b"origin", b"http://evil.example"))

    async def scenario():
        connected, _ = await comm.connect()
        return connected

    assert asyncio.run(scenario()) is False


def test_a_teammate_receives_points_and_status_of_the_run(run, teammate):
    comm = communicator(f"/ws/runs/{run.pk}/", teammate)
    points = [{"series": "reward/mean", "step": 1, "value": 0.5, "time": 1.0}]

    async def scenario():
        connected, _ = await comm.connect()
        assert connected
        await sync_to_async(events.send_points)(run.pk, points)
        first = await comm.receive_json_from(timeout=2)
        await sync_to_async(run.transition)(Run.Status.CANCELLING)
        await sync_to_async(events.send_status)(run)
        second = await comm.receive_json_from(timeout=2)
        await comm.disconnect()
        return first, second

    first, second = asyncio.run(scenario())
    assert first == {"type": "points", "points": points}
    assert second["type"] == "status" and second["run"]["status"] == "cancelling"


def test_a_run_page_does_not_see_other_runs_points(make_run, owner):
    mine, other = make_run(), make_run()
    comm = communicator(f"/ws/runs/{mine.pk}/", owner)

    async def scenario():
        await comm.connect()
        await sync_to_async(events.send_points)(other.pk, [{"series": "loss", "step": 1, "value": 1.0, "time": 1.0}])
        nothing = await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()
        return nothing

    assert asyncio.run(scenario()) is True


def test_the_runs_list_gets_status_changes_of_its_teams_only(make_run, owner, outsider):
    from runs.models import Experiment

    mine = make_run()
    theirs = make_run(experiment=Experiment.objects.get(name="theirs"))
    owner_comm = communicator("/ws/runs/", owner)
    outsider_comm = communicator("/ws/runs/", outsider)

    async def scenario():
        await owner_comm.connect()
        await outsider_comm.connect()
        await sync_to_async(events.send_status)(mine)
        await sync_to_async(events.send_status)(theirs)
        owner_got = await owner_comm.receive_json_from(timeout=2)
        owner_more = await owner_comm.receive_nothing(timeout=0.3)
        outsider_got = await outsider_comm.receive_json_from(timeout=2)
        await owner_comm.disconnect()
        await outsider_comm.disconnect()
        return owner_got, owner_more, outsider_got

    owner_got, owner_more, outsider_got = asyncio.run(scenario())
    assert owner_got["run"]["id"] == mine.pk and owner_more is True
    assert outsider_got["run"]["id"] == theirs.pk


# --- access that ends while a socket is open ---------------------------------------------


def test_a_member_removed_while_watching_a_run_gets_4403_and_no_more_points(run, teammate):
    from teams.actions import do_remove_member

    comm = communicator(f"/ws/runs/{run.pk}/", teammate)
    points = [{"series": "reward/mean", "step": 1, "value": 0.5, "time": 1.0}]

    async def scenario():
        connected, _ = await comm.connect()
        assert connected
        await sync_to_async(do_remove_member)(run.launched_by, run.experiment.team, teammate.username)
        # Queued behind the removal's word: the consumer must drop it, not send it.
        await sync_to_async(events.send_points)(run.pk, points)
        first = await comm.receive_output(timeout=2)
        await comm.disconnect()  # returns once the consumer has stopped
        return first, comm.output_queue.empty()

    first, nothing_more = asyncio.run(scenario())
    assert first == {"type": "websocket.close", "code": 4403}
    assert nothing_more


def test_a_member_deactivated_while_watching_a_run_gets_4403(run, teammate):
    comm = communicator(f"/ws/runs/{run.pk}/", teammate)

    def deactivate():
        teammate.is_active = False
        teammate.save(update_fields=["is_active"])

    async def scenario():
        await comm.connect()
        await sync_to_async(deactivate)()
        await sync_to_async(events.send_status)(run)
        first = await comm.receive_output(timeout=2)
        await comm.disconnect()
        return first, comm.output_queue.empty()

    first, nothing_more = asyncio.run(scenario())
    assert first == {"type": "websocket.close", "code": 4403}
    assert nothing_more


def test_another_teams_removal_leaves_a_run_page_streaming(run, teammate, outsider):
    from teams.models import Membership, Team

    Membership.objects.create(team=Team.objects.get(name="Elsewhere"), user=teammate)
    comm = communicator(f"/ws/runs/{run.pk}/", teammate)
    points = [{"series": "reward/mean", "step": 1, "value": 0.5, "time": 1.0}]

    async def scenario():
        await comm.connect()
        await sync_to_async(Membership.objects.filter(user=teammate, team__name="Elsewhere").delete)()
        await sync_to_async(events.send_points)(run.pk, points)
        first = await comm.receive_json_from(timeout=2)
        await comm.disconnect()
        return first

    assert asyncio.run(scenario()) == {"type": "points", "points": points}


def test_the_runs_list_stops_a_removed_teams_status_and_keeps_the_others(make_run, teammate, outsider):
    from runs.models import Experiment
    from teams.models import Membership, Team

    Membership.objects.create(team=Team.objects.get(name="Elsewhere"), user=teammate)
    lab_run = make_run()
    elsewhere_run = make_run(experiment=Experiment.objects.get(name="theirs"))
    comm = communicator("/ws/runs/", teammate)

    async def scenario():
        await comm.connect()
        await sync_to_async(Membership.objects.filter(user=teammate, team__name="Lab").delete)()
        await sync_to_async(events.send_status)(lab_run)
        await sync_to_async(events.send_status)(elsewhere_run)
        # Sent in that order: the first message is the Lab run's if the list still got it.
        first = await comm.receive_json_from(timeout=2)
        await comm.disconnect()
        return first, comm.output_queue.empty()

    first, nothing_more = asyncio.run(scenario())
    assert first["run"]["id"] == elsewhere_run.pk
    assert nothing_more
