"""Throwaway databases on a test server.

``empty_database``: created under a unique name, empty or a copy of a template,
and dropped afterwards (the fault suite's scratch ledgers; a test that needs a
second database makes it here).

``RecycledDatabases``: the ``pg_url`` fixture's (tests/conftest.py). A test's
database, once the test is done, is renamed, wiped back to what a new one holds
and handed to the process's next test, instead of dropped: creating, migrating
and dropping a ledger database cost the machine 0.14-0.27 CPU-s (embedded
PostgreSQL 15, 2026-11-29), 350 times in ``make test-fast``; renaming and
wiping one 0.02-0.05.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import psycopg
from psycopg import sql


def _new_name() -> str:
    return f"eos_test_{uuid.uuid4().hex[:12]}"


@contextmanager
def empty_database(server_address: str, *, template: str | None = None,
                   settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """The URL of a new database on the server at ``server_address`` (a URL of
    its maintenance database): empty, or a copy of database ``template`` (which
    no session may be connected to); dropped, sessions and all, on exit.
    ``settings``: the database's own defaults (``ALTER DATABASE ... SET``), in
    place before any session opens (a session keeps what it started with)."""
    name = _new_name()
    with psycopg.connect(server_address, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
                      + (sql.SQL(" TEMPLATE {}").format(sql.Identifier(template)) if template else sql.SQL("")))
        for setting, value in (settings or {}).items():
            admin.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)))
    try:
        yield _url(server_address, name)
    finally:
        with psycopg.connect(server_address, autocommit=True) as admin:
            _drop(admin, name)


def _url(server_address: str, name: str) -> str:
    return f"{server_address.rpartition('/')[0]}/{name}"


def _drop(admin: psycopg.Connection, name: str) -> None:
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# A schema of the database's own (pg_namespace's nspname): not the system's, no
# session's temporary one.
_OWN_SCHEMA = ("nspname NOT IN ('pg_catalog', 'information_schema')"
               " AND nspname NOT LIKE 'pg\\_toast%' AND nspname NOT LIKE 'pg\\_temp\\_%'")

# Everything a test can leave in a database that a new one (or a newly migrated
# ledger) does not hold, as one digest: the schemas, each relation with its
# columns, defaults, constraints, indexes and privileges, functions, triggers,
# policies, extensions, large objects, publications, the database's own settings
# and privileges. A wiped database whose digest is not the new one's is dropped.
_SHAPE = f"""
WITH user_ns AS (SELECT oid, nspname, nspacl FROM pg_namespace WHERE {_OWN_SCHEMA})
SELECT md5(coalesce(string_agg(item, E'\\n' ORDER BY item), '')) FROM (
  SELECT 'schema ' || nspname || ' ' || coalesce(nspacl::text, '') FROM user_ns
  UNION ALL
  SELECT format('relation %s %s %s %s', c.oid::regclass, c.relkind, coalesce(c.relacl::text, ''),
                (SELECT string_agg(format('%s %s %s %s', a.attname, format_type(a.atttypid, a.atttypmod),
                                          a.attnotnull, pg_get_expr(d.adbin, d.adrelid)), ', ' ORDER BY a.attnum)
                 FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped))
  FROM pg_class c JOIN user_ns n ON n.oid = c.relnamespace
  UNION ALL
  SELECT format('constraint %s %s', conrelid::regclass, pg_get_constraintdef(oid))
  FROM pg_constraint WHERE connamespace IN (SELECT oid FROM user_ns)
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index
  WHERE indexrelid IN (SELECT c.oid FROM pg_class c JOIN user_ns n ON n.oid = c.relnamespace)
  UNION ALL
  SELECT format('function %s %s', p.oid::regprocedure, md5(p.prosrc)) FROM pg_proc p
  WHERE p.pronamespace IN (SELECT oid FROM user_ns)
  UNION ALL
  SELECT format('type %s', t.oid::regtype) FROM pg_type t
  WHERE t.typnamespace IN (SELECT oid FROM user_ns) AND t.typrelid = 0 AND t.typelem = 0
  UNION ALL SELECT format('trigger %s %s', tgrelid::regclass, tgname) FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT format('policy %s %s', polrelid::regclass, polname) FROM pg_policy
  UNION ALL SELECT 'extension ' || extname FROM pg_extension
  UNION ALL SELECT 'large object ' || oid FROM pg_largeobject_metadata
  UNION ALL SELECT 'publication ' || pubname FROM pg_publication
  UNION ALL SELECT 'event trigger ' || evtname FROM pg_event_trigger
  UNION ALL SELECT 'database setting ' || array_to_string(setconfig, ',') FROM pg_db_role_setting
  WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT 'database acl ' || datacl::text FROM pg_database
  WHERE datname = current_database() AND datacl IS NOT NULL
) shape(item)
"""

# The wipe: every schema a test made dropped, public made again as a new
# database has it; in the schemas the database came with (the ledger's), the
# tables a test made (staging tables) dropped, the others' rows deleted (the
# migration records kept) and the sequences used restarted.
_WIPE = sql.SQL("""
DO $$
DECLARE s text; t text; written boolean;
BEGIN
  FOR s IN SELECT nspname FROM pg_namespace WHERE """ + _OWN_SCHEMA + """ AND nspname <> ALL ({kept}) LOOP
    EXECUTE format('DROP SCHEMA %I CASCADE', s);
  END LOOP;
  FOR t IN SELECT format('%I.%I', schemaname, tablename) FROM pg_tables
           WHERE schemaname = ANY ({kept}) AND format('%I.%I', schemaname, tablename) <> ALL ({tables}) LOOP
    EXECUTE 'DROP TABLE IF EXISTS ' || t || ' CASCADE';
  END LOOP;
  CREATE SCHEMA public AUTHORIZATION pg_database_owner;
  COMMENT ON SCHEMA public IS 'standard public schema';
  GRANT USAGE ON SCHEMA public TO PUBLIC;
  FOR t IN SELECT format('%I.%I', schemaname, tablename) FROM pg_tables
           WHERE schemaname = ANY ({kept}) AND (schemaname, tablename) NOT IN
                 (('eos', 'schema_version'), ('eos', 'target_schema_version')) LOOP
    EXECUTE 'SELECT EXISTS (SELECT FROM ' || t || ')' INTO written;
    IF written THEN EXECUTE 'TRUNCATE ' || t || ' CASCADE'; END IF;  -- only those written: each is new files
  END LOOP;
  FOR t IN SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences
           WHERE schemaname = ANY ({kept}) AND last_value IS NOT NULL LOOP
    EXECUTE 'ALTER SEQUENCE ' || t || ' RESTART';
  END LOOP;
  -- a recycled ledger is a new ledger: its identity, the time its schema was made
  -- (targets/files/identity.py), is the time of its reuse
  IF to_regclass('eos.schema_version') IS NOT NULL THEN UPDATE eos.schema_version SET applied_at = now(); END IF;
  IF to_regclass('eos.target_schema_version') IS NOT NULL THEN
    UPDATE eos.target_schema_version SET applied_at = now();
  END IF;
END $$
""")


class RecycledDatabases:
    """This process's databases for its tests, one at a time: empty, or with
    the ledger migrated (``ledger=True``). A test's database is handed to the
    process's next test under a new name, wiped: no session of the test's (a
    thread or child it left behind) can reach it, and the next test's URL is a
    new one (the ledger's reused sessions are kept per URL). One whose wipe
    fails, or leaves anything a new database does not have, is dropped.
    ``close()`` drops the ones kept."""

    def __init__(self, server_address: str) -> None:
        self.server_address = server_address
        self._kept: dict[bool, list[str]] = {False: [], True: []}
        self._shape: dict[bool, tuple[str, list[str], list[str]]] = {}  # a new one's digest, schemas, tables

    @contextmanager
    def database(self, *, ledger: bool) -> Iterator[str]:
        name = self._kept[ledger].pop() if self._kept[ledger] else self._create(ledger)
        try:
            yield _url(self.server_address, name)
        finally:
            renamed = self._recycle(name, ledger)
            if renamed is not None:
                self._kept[ledger].append(renamed)

    def close(self) -> None:
        with self._admin() as admin:
            for name in self._kept[False] + self._kept[True]:
                _drop(admin, name)
        self._kept = {False: [], True: []}

    def _admin(self) -> psycopg.Connection:
        """A session in the server's maintenance database (a new one: a test may restart the server)."""
        return psycopg.connect(self.server_address, autocommit=True)

    def _create(self, ledger: bool) -> str:
        from airflow_eos.core.database import close_idle
        from airflow_eos.core.ledger import Ledger

        name = _new_name()
        with self._admin() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = _url(self.server_address, name)
        if ledger:
            Ledger(url).migrate()
            close_idle()
        if ledger not in self._shape:
            with psycopg.connect(url, autocommit=True) as conn:
                schemas = [s for (s,) in conn.execute(
                    f"SELECT nspname FROM pg_namespace WHERE {_OWN_SCHEMA} AND nspname <> 'public'")]
                tables = [t for (t,) in conn.execute("SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables"
                                                     " WHERE schemaname = ANY (%s)", (schemas,))]
                self._shape[ledger] = (conn.execute(_SHAPE).fetchone()[0], schemas, tables)
        return name

    def _recycle(self, name: str, ledger: bool) -> str | None:
        """``name`` renamed and wiped, or None: dropped."""
        from airflow_eos.core.database import close_idle

        close_idle()  # this thread's reused sessions of the test's URL
        renamed = _new_name()
        with self._admin() as admin:
            try:
                self._rename_when_alone(admin, name, renamed)
            except psycopg.Error:
                _drop(admin, name)
                return None
        digest, schemas, tables = self._shape[ledger]
        try:
            with psycopg.connect(_url(self.server_address, renamed), autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER DATABASE {} RESET ALL").format(sql.Identifier(renamed)))
                conn.execute(_WIPE.format(kept=sql.Literal(schemas), tables=sql.Literal(tables)))
                clean = conn.execute(_SHAPE).fetchone()[0] == digest
        except psycopg.Error:
            clean = False
        if not clean:
            with self._admin() as admin:
                _drop(admin, renamed)
            return None
        return renamed

    @staticmethod
    def _rename_when_alone(admin: psycopg.Connection, name: str, renamed: str) -> None:
        """Rename database ``name`` once the test's sessions have left it: new
        ones refused meanwhile, the open ones ended (as DROP ... WITH (FORCE)
        would end them), waited for."""
        ident = sql.Identifier(name)
        admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(ident))
        deadline = time.monotonic() + 10
        while admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                            (name,)).fetchone()[0]:
            if time.monotonic() > deadline:
                raise psycopg.OperationalError(f"sessions of database {name} did not end")
            time.sleep(0.01)
        admin.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(ident, sql.Identifier(renamed)))
        admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(sql.Identifier(renamed)))
