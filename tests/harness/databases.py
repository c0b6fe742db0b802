"""A throwaway database on a test server: created empty under a unique name,
dropped afterwards (the ``pg_url`` fixture of tests/conftest.py; a test that
needs a second one makes it here)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


@contextmanager
def empty_database(server_address: str) -> Iterator[str]:
    """The URL of a new, empty database on the server at ``server_address``
    (a URL of its maintenance database); dropped, sessions and all, on exit."""
    name = f"eos_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_address, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server_address.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(server_address, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
