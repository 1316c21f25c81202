"""WebSocket consumers: live run status for the runs list, live points for a run page.

Close codes (sent after accepting, so browsers see them): 4401 not logged in,
4403 not a member of the run's team (or no such run: outsiders learn nothing), also sent
to an open run page whose user leaves the team (runs/signals.py), 4413 a
client message larger than ROLLWAY_MAX_WS_MESSAGE_BYTES, 1011 the channel layer lost
Redis (the browser reconnects and catches up).
"""

from __future__ import annotations

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from foundation.channel_layer import LOST_EVENT
from runs import events
from runs.models import Run
from teams.models import Team

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_LARGE = 4413
CLOSE_LAYER_LOST = 1011  # "internal error", as when the channel layer raised: the page retries


@database_sync_to_async
def _team_ids(user) -> set[int]:
    return set(Team.objects.for_user(user).values_list("pk", flat=True))


@database_sync_to_async
def _team_of_visible_run(user, run_id: int) -> int | None:
    """The run's team, if `user` may see the run; None otherwise."""
    return Run.objects.visible_to(user).filter(pk=run_id).values_list("experiment__team_id", flat=True).first()


# Messages whose handlers never touch the database: the run events the channel layer
# brings, and a client's frames (ignored unread).
NO_DATABASE = frozenset(
    {events.POINTS_EVENT, events.STATUS_EVENT, events.REVOKED_EVENT, LOST_EVENT, "websocket.receive"}
)


class _RefusingConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: tuple[str, ...] = ()
    # Set once the user lost access: events already queued for this socket are dropped.
    revoked = False

    async def dispatch(self, message: dict) -> None:
        # Channels closes stale database connections before every handler, in a thread
        # hop (sync_to_async) per message and viewer: with many viewers on a live run, a
        # large share of the web process's time (docs/performance.md). These handlers use
        # no connection to close.
        if message["type"] in NO_DATABASE:
            handler = getattr(self, get_handler_name(message))
            await handler(message)
            return
        await super().dispatch(message)

    async def refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def listen_for_revocation(self, user) -> None:
        # Joined before access is checked, so a removal committed between the check and
        # the join of the run's group still reaches this socket.
        await self.channel_layer.group_add(events.user_group(user.pk), self.channel_name)
        self.groups_joined = (events.user_group(user.pk),)

    async def join(self, *groups: str) -> None:
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined = (*self.groups_joined, *groups)
        await self.accept()

    async def leave(self) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = ()

    async def channel_layer_lost(self, event: dict) -> None:
        # Redis went away (foundation/channel_layer.py): events published meanwhile are lost,
        # so the socket closes and the page catches up from the API when it reconnects.
        await self.close(code=CLOSE_LAYER_LOST)

    async def disconnect(self, code) -> None:
        await self.leave()

    async def revoke(self) -> None:
        self.revoked = True
        await self.leave()
        await self.close(code=CLOSE_FORBIDDEN)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        # Measured before anything decodes it: a frame larger than a browser ever sends
        # here closes the socket instead of being parsed.
        size = len(text_data.encode()) if text_data is not None else len(bytes_data or b"")
        if size > settings.ROLLWAY_MAX_WS_MESSAGE_BYTES:
            await self.close(code=CLOSE_TOO_LARGE)
            return
        # Anything smaller is ignored unread: the stream is server → browser only, and
        # parsing a frame could only raise (not JSON, nested too deep, binary).


class RunsConsumer(_RefusingConsumer):
    """/ws/runs/: status changes of every run in the user's teams."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self.refuse(CLOSE_UNAUTHENTICATED)
        await self.listen_for_revocation(user)
        # Read once: joining a team takes effect on the next connection, leaving one at
        # once (access_revoked).
        self.team_ids = await _team_ids(user)
        await self.join(events.RUNS_GROUP)

    async def run_status(self, event: dict) -> None:
        if event["team_id"] in self.team_ids and not self.revoked:
            await self.send_json({"type": "status", "run": event["run"]})

    async def access_revoked(self, event: dict) -> None:
        # The list goes on for the teams the user is still in; an account that lost
        # everything is closed.
        if event["team_id"] is None:
            await self.revoke()
        else:
            self.team_ids.discard(event["team_id"])


class RunConsumer(_RefusingConsumer):
    """/ws/runs/<id>/: the run's metric points as they are ingested, and its status."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self.refuse(CLOSE_UNAUTHENTICATED)
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        await self.listen_for_revocation(user)
        self.team_id = await _team_of_visible_run(user, run_id)
        if self.team_id is None:
            await self.leave()
            return await self.refuse(CLOSE_FORBIDDEN)
        await self.join(events.run_group(run_id))

    async def metrics_points(self, event: dict) -> None:
        # Encoded once for the whole group by events.send_points.
        if not self.revoked:
            await self.send(text_data=event["frame"])

    async def run_status(self, event: dict) -> None:
        if not self.revoked:
            await self.send_json({"type": "status", "run": event["run"]})

    async def access_revoked(self, event: dict) -> None:
        if event["team_id"] in (None, self.team_id):
            await self.revoke()
