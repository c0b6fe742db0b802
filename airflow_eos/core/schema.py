"""Applying the ledger's migrations: the core's (core/migrations.py), then
each registered target kind's own (``TargetSpec.ledger_migrations``).

The core's versions are rows of ``eos.schema_version``; a kind's own steps are
rows of ``eos.target_schema_version``, created when a first such step is
applied. Steps a kind shipped as core versions (``shipped_as``) are applied in
their place of the core's sequence and recorded as that core version, so a new
ledger gets the schema it always got and a ledger migrated before is complete.
Concurrent callers serialise on the advisory lock ``Ledger.migrate`` takes
before anything else, because even ``CREATE SCHEMA IF NOT EXISTS`` races on the
catalog's unique index.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_eos.core.errors import LedgerUnavailable
from airflow_eos.core.migrations import TargetMigration
from airflow_eos.core.registry import kind_class, registered_kinds

if TYPE_CHECKING:  # psycopg is loaded by core.database.connect
    import psycopg

log = logging.getLogger(__name__)

TARGET_VERSIONS = (
    "CREATE TABLE IF NOT EXISTS eos.target_schema_version ("
    " kind text NOT NULL, version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),"
    " PRIMARY KEY (kind, version))"
)


def target_migrations() -> dict[str, Sequence[TargetMigration]]:
    """Every registered kind's own steps (``TargetSpec.ledger_migrations``;
    kinds with none left out)."""
    return {kind: steps for kind in registered_kinds() if (steps := kind_class(kind).ledger_migrations())}


def apply_migrations(conn: psycopg.Connection, core: Sequence[tuple[int, str | None]], current: int) -> None:
    """Bring schema ``eos`` from core version ``current`` to the last of
    ``core``, then each registered target kind to its last step. The caller
    holds the migration lock in ``conn``'s transaction."""
    kinds = target_migrations()
    shipped: dict[int, list[str]] = {}
    for steps in kinds.values():
        for step in steps:
            if step.shipped_as is not None:
                shipped.setdefault(step.shipped_as, []).append(step.sql)
    for version, sql in core:
        if version > current:
            log.info("applying ledger migration %d", version)
            for text in ([sql] if sql else []) + shipped.get(version, []):
                conn.execute(text)
            conn.execute("INSERT INTO eos.schema_version (version) VALUES (%s)", (version,))
    core_version = max([current, *(version for version, _ in core)])
    for kind, steps in kinds.items():
        _apply_kind(conn, kind, steps, core_version)


def _apply_kind(conn: psycopg.Connection, kind: str, steps: Sequence[TargetMigration], core_version: int) -> None:
    """The kind's steps after those the ledger has: the ones shipped as core
    versions up to ``core_version``, and those ``eos.target_schema_version``
    records."""
    had = max((s.version for s in steps if s.shipped_as is not None and s.shipped_as <= core_version), default=0)
    recorded = 0
    if conn.execute("SELECT to_regclass('eos.target_schema_version') IS NOT NULL").fetchone()[0]:
        recorded = conn.execute("SELECT coalesce(max(version), 0) FROM eos.target_schema_version WHERE kind = %s",
                                (kind,)).fetchone()[0]
    if recorded > steps[-1].version:
        raise LedgerUnavailable(f"the ledger's tables of target kind {kind!r} are at version {recorded}, newer than "
                                f"this airflow-eos knows ({steps[-1].version}); upgrade airflow-eos")
    for step in steps:
        if step.version <= max(had, recorded):
            continue
        if step.shipped_as is not None:  # its core version is not reached: nor are the steps after it
            return
        log.info("applying ledger migration %d of target kind %r", step.version, kind)
        conn.execute(TARGET_VERSIONS)
        conn.execute(step.sql)
        conn.execute("INSERT INTO eos.target_schema_version (kind, version) VALUES (%s, %s)", (kind, step.version))
