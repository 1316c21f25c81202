"""The embedded broker: a message a consumer takes is always whole, however the
producer's writes and the consumer's listings interleave."""

from __future__ import annotations

import threading

from kombu import Connection

from foundation.fs_broker import Transport

MESSAGES = 3000


def exchange(tmp_path, transport) -> list[int]:
    """Publish MESSAGES from a thread while consuming them here; the ids received."""
    options = {
        "data_folder_in": str(tmp_path / "queue"),
        "data_folder_out": str(tmp_path / "queue"),
        "control_folder": str(tmp_path / "control"),  # else kombu makes ./control
    }
    (tmp_path / "queue").mkdir()
    (tmp_path / "control").mkdir()
    padding = "x" * 20_000  # a long write widens the window between create and complete

    def produce():
        with Connection("filesystem://", transport=transport, transport_options=options) as conn:
            queue = conn.SimpleQueue("q")
            for i in range(MESSAGES):
                queue.put({"i": i, "padding": padding})

    producer = threading.Thread(target=produce)
    received: list[int] = []
    with Connection("filesystem://", transport=transport, transport_options=options) as conn:
        queue = conn.SimpleQueue("q")
        producer.start()
        while len(received) < MESSAGES:
            message = queue.get(timeout=20)
            received.append(message.payload["i"])
            message.ack()
    producer.join()
    return received


def test_every_message_arrives_whole_and_once(tmp_path):
    assert sorted(exchange(tmp_path, Transport)) == list(range(MESSAGES))
