"""A target kind's own tables in the ledger (TargetSpec.ledger_migrations),
applied by Ledger.migrate with the core's: a new ledger gets the schema the
core's list alone gave before kinds had tracks of their own, a ledger that
list migrated is complete and left as it is, and a kind's own later steps are
applied once, under the migration lock, and recorded per kind."""

from __future__ import annotations

import psycopg
import pytest
from harness.concurrency import at_once
from harness.databases import empty_database

import airflow_eos.core.ledger as ledger_module
import airflow_eos.core.schema as schema
from airflow_eos.core.errors import LedgerUnavailable
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.migrations import LATEST_VERSION, MIGRATIONS, TargetMigration


@pytest.fixture
def other_url(pg_server):
    """A second fresh database on the session's server."""
    with empty_database(pg_server.address) as url:
        yield url


def migrate_as_before_tracks(url: str, monkeypatch, upto: int = LATEST_VERSION) -> None:
    """Migrate ``url`` to core version ``upto`` as airflow-eos did while the
    kinds' tables were steps of the core's list: each step a kind shipped as a
    core version is that version's SQL, and no kind has steps of its own."""
    shipped = {step.shipped_as: step.sql for steps in schema.target_migrations().values() for step in steps
               if step.shipped_as is not None}
    core = [(version, shipped[version] if sql is None else sql) for version, sql in MIGRATIONS if version <= upto]
    with monkeypatch.context() as before:
        before.setattr(ledger_module, "MIGRATIONS", core)
        before.setattr(ledger_module, "LATEST_VERSION", upto)
        before.setattr(schema, "target_migrations", lambda: {})
        assert Ledger(url).migrate() == upto


def only_steps_shipped_as_core_versions(monkeypatch) -> None:
    """The registered kinds' steps that shipped as core versions, without the
    kinds' own later steps (the Iceberg target's catalog tables): what the two
    ways of migrating must agree on; the kinds' own steps are a second stage,
    tested by test_every_kinds_own_steps_follow_the_core_and_are_recorded."""
    registered = schema.target_migrations()
    shipped = {kind: tuple(s for s in steps if s.shipped_as is not None) for kind, steps in registered.items()}
    monkeypatch.setattr(schema, "target_migrations", lambda: {k: v for k, v in shipped.items() if v})


def catalog(url: str) -> dict[str, list[tuple]]:
    """What schema ``eos`` holds: columns, constraints, indexes, functions, and
    the version rows (with when each was applied)."""
    queries = {
        "columns": "SELECT table_name, ordinal_position, column_name, data_type, is_nullable, column_default"
                   " FROM information_schema.columns WHERE table_schema = 'eos'",
        "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
                       " WHERE connamespace = 'eos'::regnamespace",
        "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'eos'",
        "functions": "SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = 'eos'::regnamespace",
        "schemas": "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'eos%'",
        "versions": "SELECT version, applied_at FROM eos.schema_version",
    }
    with psycopg.connect(url) as conn:
        return {what: sorted(conn.execute(sql).fetchall()) for what, sql in queries.items()}


def without_times(snapshot: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    return {**snapshot, "versions": [version for version, _ in snapshot["versions"]]}


def test_a_new_ledger_gets_the_schema_the_core_list_alone_gave(pg_url, other_url, monkeypatch):
    migrate_as_before_tracks(other_url, monkeypatch)
    only_steps_shipped_as_core_versions(monkeypatch)
    assert Ledger(pg_url).migrate() == LATEST_VERSION
    new = catalog(pg_url)
    assert without_times(new) == without_times(catalog(other_url))
    assert {"kafka_commits", "kafka_intents"} <= {table for table, *_ in new["columns"]}
    assert "target_schema_version" not in {table for table, *_ in new["columns"]}  # no kind has steps of its own


def test_a_ledger_at_the_latest_core_version_migrates_without_change(pg_url, monkeypatch):
    migrate_as_before_tracks(pg_url, monkeypatch)
    only_steps_shipped_as_core_versions(monkeypatch)
    before = catalog(pg_url)
    assert at_once([lambda: Ledger(pg_url).migrate()] * 4) == [(LATEST_VERSION, None)] * 4
    assert catalog(pg_url) == before  # the same versions, applied when they were


@pytest.mark.parametrize("upto", [7, 8, 11])
def test_a_ledger_from_before_a_kinds_tables_gets_them_in_place(pg_url, other_url, monkeypatch, upto):
    """Core version 7 had no Kafka table, 8 to 11 had eos.kafka_commits only."""
    migrate_as_before_tracks(pg_url, monkeypatch, upto)
    assert Ledger(pg_url).migrate() == LATEST_VERSION
    Ledger(other_url).migrate()
    assert without_times(catalog(pg_url)) == without_times(catalog(other_url))


def test_a_kinds_own_steps_are_applied_once_under_concurrent_callers(pg_url, monkeypatch):
    registered = schema.target_migrations()
    steps = [TargetMigration(1, "CREATE TABLE eos.probe_things (thing text PRIMARY KEY)")]
    monkeypatch.setattr(schema, "target_migrations", lambda: {**registered, "probe": tuple(steps)})
    ledger = Ledger(pg_url)
    assert at_once([ledger.migrate] * 8) == [(LATEST_VERSION, None)] * 8  # each call's (result, error)

    steps.append(TargetMigration(2, "ALTER TABLE eos.probe_things ADD COLUMN seen integer"))
    assert ledger.migrate() == ledger.migrate() == LATEST_VERSION
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT kind, version FROM eos.target_schema_version WHERE kind = 'probe'"
                            " ORDER BY version").fetchall() == [("probe", 1), ("probe", 2)]
        assert conn.execute("SELECT max(version) FROM eos.schema_version").fetchone()[0] == LATEST_VERSION
        conn.execute("INSERT INTO eos.probe_things VALUES ('a', 1)")  # both steps in place
        conn.execute("INSERT INTO eos.target_schema_version (kind, version) VALUES ('probe', 3)")  # a newer release's

    with pytest.raises(LedgerUnavailable, match="target kind 'probe' are at version 3, newer than this airflow-eos "
                                                "knows \\(2\\); upgrade airflow-eos"):
        ledger.migrate()


def test_every_kinds_own_steps_follow_the_core_and_are_recorded(pg_url, monkeypatch):
    """A ledger the core's list migrated gets each kind's own steps (those
    that never shipped as core versions) on its next migrate, once, recorded
    per kind; a new ledger gets the same."""
    migrate_as_before_tracks(pg_url, monkeypatch)
    own = {kind: max(s.version for s in steps) for kind, steps in schema.target_migrations().items()
           if any(s.shipped_as is None for s in steps)}
    assert own  # the Iceberg target's catalog tables and intents
    assert at_once([lambda: Ledger(pg_url).migrate()] * 4) == [(LATEST_VERSION, None)] * 4
    with psycopg.connect(pg_url) as conn:
        recorded = dict(conn.execute("SELECT kind, max(version) FROM eos.target_schema_version GROUP BY kind"))
    assert recorded == own
