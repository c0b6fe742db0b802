"""A throwaway database on a test server: created under a unique name, empty or
a copy of a template, and dropped afterwards (the ``pg_url`` fixture of
tests/conftest.py, the fault suite's scratch ledgers; a test that needs a
second one makes it here)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import psycopg


@contextmanager
def empty_database(server_address: str, *, template: str | None = None,
                   settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """The URL of a new database on the server at ``server_address`` (a URL of
    its maintenance database): empty, or a copy of database ``template`` (which
    no session may be connected to); dropped, sessions and all, on exit.
    ``settings``: the database's own defaults (``ALTER DATABASE ... SET``), in
    place before any session opens (a session keeps what it started with)."""
    name = f"eos_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_address, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        for setting, value in (settings or {}).items():
            admin.execute(psycopg.sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Identifier(setting), psycopg.sql.Literal(value)))
    base, _, _ = server_address.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(server_address, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
