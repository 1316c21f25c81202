"""The channel layer: channels_redis's pub/sub layer, told to its consumers when Redis is lost.

Why pub/sub: a message to a group is one PUBLISH, received once per web process and
handed to each of its consumers in memory. channels_redis's default layer
(`core.RedisChannelLayer`) writes one copy per consumer into Redis and pops each back
with its own round trip: at 200 viewers of a live run, a thousand Redis round trips a
second, and frames reach the browsers later (docs/performance.md).

What pub/sub gives up is delivery while Redis is away: a message published then is
gone, and channels_redis's pub/sub layer only logs the broken connection while its
consumers wait on, unaware. The run page catches up from the metrics API whenever its
socket reconnects, so here a lost connection is told to every consumer of the process
(`LOST_EVENT`), which closes its socket: the page polls, reconnects when Redis is back
and fills in what it missed. The subscriber's connection never retries on its own for
that reason (a silent reconnect would hide the gap); publishing does retry
(`publish_retry`), so the first call after a Redis restart does not fail on the pool's
dead connection.

This subclasses channels_redis's pub/sub classes (4.x) at two points: the receive loop
and the connections it makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer, RedisSingleShardConnection
from channels_redis.utils import _close_redis, _wrap_close, create_pool, decode_hosts
from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

# Sent to every consumer of a process whose subscriber connection to Redis broke
# (handled by runs.consumers: the socket closes, the page catches up when it reconnects).
LOST_EVENT = "channel_layer.lost"


def publish_retry() -> dict:
    """redis-py connection options for the publishing side: a command on a connection
    Redis dropped (a restart) reconnects and runs again, three times with backoff
    (0.05, 0.1, 0.2 s), instead of failing once per pooled connection."""
    return {
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError, OSError],
    }


class _Shard(RedisSingleShardConnection):
    """One Redis: a client that publishes (retrying) and a pub/sub connection that
    subscribes (never retrying: its loss is told instead)."""

    _subscriber: aioredis.Redis | None = None

    def _ensure_redis(self) -> None:
        if self._redis is None:
            self._redis = aioredis.Redis(connection_pool=create_pool(self.host))
            quiet = {k: v for k, v in self.host.items() if k not in ("retry", "retry_on_error")}
            self._subscriber = aioredis.Redis(connection_pool=create_pool(quiet))
            self._pubsub = self._subscriber.pubsub()

    async def _do_receiving(self) -> None:
        # channels_redis's loop, but a broken connection is a loss to report, not an
        # exception to log every second.
        while True:
            try:
                if self._pubsub and self._pubsub.subscribed:
                    message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
                    self._receive_message(message)
                else:
                    await asyncio.sleep(0.1)
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                logger.warning("channel layer: lost Redis (%s); closing this process's live sockets", exc)
                await self._lost()
            except Exception:
                logger.exception("channel layer: unexpected error receiving from Redis")
                await asyncio.sleep(1)

    async def _lost(self) -> None:
        """Tell every consumer, then forget every subscription and connection: the
        consumers close, and the next subscribe connects afresh."""
        layer = self.channel_layer
        lost = layer.channel_layer.serialize({"type": LOST_EVENT})
        for queue in layer.channels.values():
            queue.put_nowait(lost)
        # Their cleanup (unsubscribe, group_discard) then finds nothing to undo in Redis.
        layer.channels.clear()
        layer.groups.clear()
        async with self._lock:
            for client in (self._redis, self._subscriber):
                if client is not None:
                    with contextlib.suppress(Exception):
                        await _close_redis(client)
            self._redis = self._subscriber = self._pubsub = None
            self._subscribed_to = set()

    async def flush(self) -> None:
        subscriber = self._subscriber
        await super().flush()
        if subscriber is not None:
            await _close_redis(subscriber)
        self._subscriber = None


class _LoopLayer(RedisPubSubLoopLayer):
    def __init__(self, hosts=None, **kwargs):
        super().__init__(hosts, **kwargs)
        self._shards = [_Shard(host, self) for host in decode_hosts(hosts)]


class PubSubChannelLayer(RedisPubSubChannelLayer):
    """channels_redis's RedisPubSubChannelLayer with the shards above."""

    def _get_layer(self):
        loop = asyncio.get_running_loop()
        try:
            return self._layers[loop]
        except KeyError:
            layer = self._layers[loop] = _LoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)
            return layer
