"""Column arrays sent to PostgreSQL in binary, for the ingest's bulk statements.

Django's psycopg backend binds parameters on the client by default: every element of a
list is quoted into SQL text in Python (a regular expression per element), a large share
of the ingest's CPU (the point upsert and the rollups' bucket upsert each send thousands
of numbers per request). A server-binding cursor on the same connection sends `%b`
parameters in PostgreSQL's binary format instead: same transaction, same rows, a fraction
of the CPU (docs/performance.md).
"""

from __future__ import annotations

from contextlib import contextmanager

import psycopg


@contextmanager
def binary_cursor(connection, binary_results: bool = False):
    """A Django cursor (execute wrappers and query logging apply) over a server-binding
    psycopg cursor of `connection`, a PostgreSQL connection: `%b` placeholders bind in
    binary, and a list binds as an array; with `binary_results`, rows come back in
    binary too (no number parsed from text)."""
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    if binary_results:
        raw.format = psycopg.pq.Format.BINARY
    cursor = connection.make_cursor(raw)
    try:
        yield cursor
    finally:
        cursor.close()
