"""Celery's embedded broker (`filesystem://`, for `make run`): kombu's filesystem
transport, with messages that appear whole.

kombu writes a message by creating its file in the queue folder and then writing into
it. A consumer that lists the folder in between moves the still-empty file away, fails
to decode it and the Celery worker dies (kombu issue #1551, seen here as a worker exit
in the middle of a 40-run comparison); the bytes written after the move are lost with
it. Here a message is written under a name no queue matches and renamed into place,
which is atomic within a folder: a consumer sees all of it or none of it.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    # kombu's filesystem channel names the argument `payload`, its base `message`.
    def _put(self, queue, payload, **kwargs):  # type: ignore[override]
        """Put `payload` onto `queue`: written beside it, then renamed into the queue."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot and no ".<queue>.msg" tail: no consumer's listing takes it.
        partial = os.path.join(self.data_folder_out, f".{uuid.uuid4()}.partial")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
