"""The ledger: the single source of truth, in schema ``eos`` of the target database.

Ledger and published data share one database so that a window's rows and its
offsets commit in one transaction. This module owns every SQL statement on the
``eos`` tables that planning and reading a pipeline's state (``airflow-eos
status`` and ``release``) need; core/attempt/ adds the statements of an
attempt's steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_eos.core.database import redact, reused
from airflow_eos.core.errors import LedgerUnavailable, WindowConflict
from airflow_eos.core.migrations import LATEST_VERSION, MIGRATIONS
from airflow_eos.core.ownership import Claim
from airflow_eos.core.schema import apply_migrations
from airflow_eos.core.windows import Cut, PartitionRange, TopicPartition, Window, WindowPlan

if TYPE_CHECKING:  # psycopg is loaded by core.database.connect, not by importing the ledger
    import psycopg

# pg_advisory_xact_lock key for migrations: any constant, shared by all versions.
_MIGRATION_LOCK = 0x656F735F6D6967  # "eos_mig"
# First key of the two-key advisory lock on a target's claims (the second is a
# hash of the target); two-key locks never collide with the one-key one above.
_CLAIM_LOCK = 0x656F7374  # "eost"
# First key of the two-key advisory lock on a pipeline's offsets mirror.
_MIRROR_LOCK = 0x656F736D  # "eosm"


class WindowState(str, Enum):
    """A window's state, stored in ``eos.windows.state`` as its value: planned
    (frozen, maybe staged) until one attempt of it commits."""

    PLANNED = "planned"
    COMMITTED = "committed"

    def __str__(self) -> str:  # the value in messages and f-strings, not "WindowState.PLANNED"
        return self.value


class WindowRecord(NamedTuple):
    """A window's row in ``eos.windows``, as ``airflow-eos status`` shows it."""

    start: datetime
    end: datetime
    state: WindowState
    epoch: int
    published_rows: int | None
    dead_letter_rows: int | None
    committed_at: datetime | None
    committed_epoch: int | None = None
    announced_epoch: int | None = None  # the committed epoch whose commit step ran to its end


def _claim(row: tuple) -> Claim:
    pipeline, topics, dag_id, target, exclusive, place = row
    return Claim(pipeline, tuple(topics), dag_id, target, exclusive, place)


@dataclass(frozen=True)
class CutContext:
    """What the ledger already knows around one instant of one partition.

    ``frozen`` is the cut itself if it was resolved before; otherwise a new cut
    must land in ``[lower, upper]`` so that cuts stay monotone in time.
    ``new_partition`` says the window that ends at this instant was planned
    without this partition, so its earlier records belong to the next window.
    """

    frozen: int | None = None
    lower: int | None = None
    upper: int | None = None
    new_partition: bool = False


class Ledger:
    def __init__(self, url: str, *, connect_timeout: int = 10):
        self.url = url
        self.connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"Ledger({redact(self.url)!r})"

    @contextlib.contextmanager
    def connect(self) -> Iterator[psycopg.Connection]:
        """A connection in a transaction of its own (not autocommit): what is not
        committed in the block is rolled back after it. Reused within a thread
        (core.database.reused): a step opens the ledger many times."""
        with reused(self.url, "ledger", autocommit=False, connect_timeout=self.connect_timeout) as conn:
            yield conn

    # ------------------------------------------------------------------ schema

    def has_tables(self, conn: psycopg.Connection, *tables: str) -> bool:
        """Each of ``tables`` (``eos.windows``, ...) exists: False in a database
        where airflow-eos never ran (and no migration is attempted)."""
        return conn.execute("SELECT " + " AND ".join(["to_regclass(%s) IS NOT NULL"] * len(tables)),
                            tables).fetchone()[0]

    def migrate(self) -> int:
        """Bring schema ``eos`` to the latest version, the target kinds' own
        tables included (core/schema.py); safe to call concurrently and
        again. Returns the core version now in place."""
        with self.connect() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute("CREATE SCHEMA IF NOT EXISTS eos")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS eos.schema_version ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            current = conn.execute("SELECT coalesce(max(version), 0) FROM eos.schema_version").fetchone()[0]
            if current > LATEST_VERSION:
                raise LedgerUnavailable(
                    f"ledger schema is at version {current}, newer than this airflow-eos knows "
                    f"({LATEST_VERSION}); upgrade airflow-eos"
                )
            apply_migrations(conn, MIGRATIONS, current)
            return LATEST_VERSION

    # ------------------------------------------------------------------ plans

    def load_plan(self, conn: psycopg.Connection, window: Window) -> WindowPlan | None:
        """The frozen plan of a window, or None if it was never planned.

        A window planned with the same start but another end is a conflict:
        the DAG's schedule changed under a pipeline that already has windows.
        """
        # reader_schema through the row's JSON: readers that never migrate read ledgers from before migration 13
        row = conn.execute(
            "SELECT window_end, to_jsonb(w) ->> 'reader_schema' FROM eos.windows w"
            " WHERE pipeline = %s AND window_start = %s",
            (window.pipeline, window.start),
        ).fetchone()
        if row is None:
            return None
        if row[0] != window.end:
            raise WindowConflict(
                f"window {window} was planned before with end {row[0].isoformat()}; "
                "a pipeline's windows cannot change their boundaries"
            )
        ranges = conn.execute(
            "SELECT topic, partition, start_offset, end_offset FROM eos.window_ranges"
            " WHERE pipeline = %s AND window_start = %s ORDER BY topic, partition",
            (window.pipeline, window.start),
        ).fetchall()
        return WindowPlan(window, tuple(PartitionRange(*r) for r in ranges), row[1])

    def cut_contexts(
        self, conn: psycopg.Connection, window: Window, tps: list[TopicPartition]
    ) -> dict[tuple[TopicPartition, datetime], CutContext]:
        """For each partition and both boundaries of the window: the frozen cut or
        its frozen neighbours, in one round trip."""
        topics = [tp.topic for tp in tps]
        partitions = [tp.partition for tp in tps]
        rows = conn.execute(
            """
            WITH tp AS (SELECT * FROM unnest(%(topics)s::text[], %(partitions)s::int[]) AS x(topic, partition)),
                 t AS (SELECT unnest(%(instants)s::timestamptz[]) AS at)
            SELECT tp.topic, tp.partition, t.at,
                   (SELECT "offset" FROM eos.cuts c WHERE c.pipeline = %(p)s AND c.topic = tp.topic
                      AND c.partition = tp.partition AND c.at = t.at),
                   (SELECT "offset" FROM eos.cuts c WHERE c.pipeline = %(p)s AND c.topic = tp.topic
                      AND c.partition = tp.partition AND c.at < t.at ORDER BY c.at DESC LIMIT 1),
                   (SELECT "offset" FROM eos.cuts c WHERE c.pipeline = %(p)s AND c.topic = tp.topic
                      AND c.partition = tp.partition AND c.at > t.at ORDER BY c.at ASC LIMIT 1),
                   EXISTS (SELECT 1 FROM eos.windows w WHERE w.pipeline = %(p)s AND w.window_end = t.at)
                   AND NOT EXISTS (SELECT 1 FROM eos.window_ranges r JOIN eos.windows w USING (pipeline, window_start)
                      WHERE w.pipeline = %(p)s AND w.window_end = t.at
                        AND r.topic = tp.topic AND r.partition = tp.partition)
            FROM tp CROSS JOIN t
            """,
            {"p": window.pipeline, "topics": topics, "partitions": partitions,
             "instants": [window.start, window.end]},
        ).fetchall()
        return {
            (TopicPartition(topic, partition), at): CutContext(frozen, lower, upper, bool(new_partition))
            for topic, partition, at, frozen, lower, upper, new_partition in rows
        }

    @staticmethod
    def durable_commit(conn: psycopg.Connection) -> None:
        """Make this transaction's COMMIT return only once it is on disk, whatever
        the server's ``synchronous_commit``: for a decision that an effect
        outside the database follows (a file target's rename, a Kafka
        transaction). With ``synchronous_commit=off`` the server acknowledges a
        commit before writing it, and a crash then loses a decision whose
        effect already happened."""
        conn.execute("SET LOCAL synchronous_commit = on")

    def lock_pipeline(self, conn: psycopg.Connection, pipeline: str) -> None:
        """Serialise planners of one pipeline: freezing is short, so a row lock
        held for the freezing transaction costs nothing and removes every race."""
        conn.execute("INSERT INTO eos.pipelines (pipeline) VALUES (%s) ON CONFLICT DO NOTHING", (pipeline,))
        conn.execute("SELECT 1 FROM eos.pipelines WHERE pipeline = %s FOR UPDATE", (pipeline,))

    def lock_mirror(self, conn: psycopg.Connection, pipeline: str) -> None:
        """Serialise the offsets mirrors of one pipeline (held for the
        transaction, across the mirror's Kafka call): see steps.commit. An
        advisory lock, not the pipeline row, so that commits never wait on
        Kafka; a hash collision only serialises two pipelines' mirrors."""
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_MIRROR_LOCK, pipeline))

    # ------------------------------------------------------------------ reading a pipeline

    _WINDOW_RECORD = ("SELECT window_start, window_end, state, epoch, published_rows, dead_letter_rows, committed_at,"
                      " committed_epoch, announced_epoch FROM eos.windows WHERE pipeline = %s")

    def windows(self, conn: psycopg.Connection, pipeline: str) -> list[WindowRecord]:
        """Every window of the pipeline, oldest first."""
        rows = conn.execute(self._WINDOW_RECORD + " ORDER BY window_start", (pipeline,)).fetchall()
        return [WindowRecord(start, end, WindowState(state), *rest) for start, end, state, *rest in rows]

    def mark_announced(self, conn: psycopg.Connection, window: Window, epoch: int) -> bool:
        """The commit step of the window's committed ``epoch`` ran to its end.
        True if this call announced it (no commit step of that epoch had)."""
        cur = conn.execute("UPDATE eos.windows SET announced_epoch = %s WHERE pipeline = %s AND window_start = %s"
                           " AND committed_epoch = %s AND announced_epoch IS DISTINCT FROM %s",
                           (epoch, window.pipeline, window.start, epoch, epoch))
        return cur.rowcount == 1

    def window(self, conn: psycopg.Connection, window: Window) -> WindowRecord | None:
        """The window's row, or None if it was never planned."""
        row = conn.execute(self._WINDOW_RECORD + " AND window_start = %s", (window.pipeline, window.start)).fetchone()
        if row is None:
            return None
        start, end, state, *rest = row
        return WindowRecord(start, end, WindowState(state), *rest)

    PUBLICATIONS_SINCE_VERSION = 7

    def unpublished_windows(self, conn: psycopg.Connection, pipeline: str) -> dict[datetime, int]:
        """The pipeline's windows that are *decided, not published*: committed
        in the ledger (offsets advanced) by an attempt whose publication, for a
        target without transactions of its own (eos.publications), has not
        reached the target: invisible to its readers. window start -> epoch."""
        if not self._schema_at_least(conn, self.PUBLICATIONS_SINCE_VERSION):
            return {}
        return dict(conn.execute(
            "SELECT w.window_start, w.committed_epoch FROM eos.windows w JOIN eos.publications p"
            " ON p.pipeline = w.pipeline AND p.window_start = w.window_start AND p.epoch = w.committed_epoch"
            " WHERE w.pipeline = %s AND w.state = 'committed' AND p.state = 'decided'", (pipeline,)).fetchall())

    def pipelines_with_windows(self, conn: psycopg.Connection, *, limit: int) -> list[str]:
        """The first ``limit`` pipelines, by name, that have windows."""
        return [p for (p,) in conn.execute("SELECT DISTINCT pipeline FROM eos.windows ORDER BY 1 LIMIT %s",
                                           (limit,))]

    def planned_partitions(self, conn: psycopg.Connection, pipeline: str) -> set[TopicPartition]:
        """Every partition a window of the pipeline was planned over."""
        return {TopicPartition(t, p) for t, p in conn.execute(
            "SELECT DISTINCT topic, partition FROM eos.window_ranges WHERE pipeline = %s", (pipeline,))}

    def has_pipeline(self, conn: psycopg.Connection, pipeline: str) -> bool:
        """The pipeline has a row in ``eos.pipelines`` (it was planned once)."""
        return conn.execute("SELECT EXISTS (SELECT 1 FROM eos.pipelines WHERE pipeline = %s)",
                            (pipeline,)).fetchone()[0]

    def pipelines(self, conn: psycopg.Connection, *, limit: int) -> list[str]:
        """The first ``limit`` pipelines of the ledger, by name."""
        return [p for (p,) in conn.execute("SELECT pipeline FROM eos.pipelines ORDER BY 1 LIMIT %s", (limit,))]

    # ------------------------------------------------------------------ verify runs

    VERIFY_RUNS_SINCE_VERSION = 10
    _VERIFY_COLUMNS = ("target", "clean", "committed_windows", "kafka_records", "published_rows", "dead_letters",
                       "duplicates", "missing", "extra", "violations")

    def records_verify_runs(self, conn: psycopg.Connection) -> bool:
        """The ledger's schema keeps the last verify of each pipeline (for readers that do not migrate it)."""
        return self._schema_at_least(conn, self.VERIFY_RUNS_SINCE_VERSION)

    def record_verify_run(self, pipeline: str, run: Mapping[str, Any]) -> bool:
        """Keep ``run`` (the keys of ``_VERIFY_COLUMNS``) as the pipeline's last
        verify; False (nothing written) where the schema predates it."""
        cols = self._VERIFY_COLUMNS
        with self.connect() as conn, conn.transaction():
            if not self.records_verify_runs(conn):
                return False
            conn.execute(
                f"INSERT INTO eos.verify_runs (pipeline, verified_at, {', '.join(cols)})"
                f" VALUES (%s, now(), {', '.join(['%s'] * len(cols))})"
                f" ON CONFLICT (pipeline) DO UPDATE SET verified_at = now(), "
                + ", ".join(f"{c} = EXCLUDED.{c}" for c in cols),
                (pipeline, *(run[c] for c in cols)))
        return True

    def last_verify_run(self, conn: psycopg.Connection, pipeline: str) -> dict[str, Any] | None:
        """The pipeline's last recorded verify (``verified_at`` and ``_VERIFY_COLUMNS``), or None."""
        if not self.records_verify_runs(conn):
            return None
        row = conn.execute(f"SELECT verified_at, {', '.join(self._VERIFY_COLUMNS)} FROM eos.verify_runs"
                           " WHERE pipeline = %s", (pipeline,)).fetchone()
        return dict(zip(("verified_at", *self._VERIFY_COLUMNS), row)) if row else None

    # ------------------------------------------------------------------ ownership

    # target_place through the row's JSON: readers that never migrate (the CLI,
    # the UI) read ledgers from before migration 11 too, where it is null.
    _CLAIM_COLUMNS = "pipeline, topics, dag_id, target, target_exclusive, to_jsonb(p) ->> 'target_place'"
    CLAIMS_SINCE_VERSION = 5

    def records_claims(self, conn: psycopg.Connection) -> bool:
        """The ledger's schema has claims (for readers that do not migrate it)."""
        return self._schema_at_least(conn, self.CLAIMS_SINCE_VERSION)

    @staticmethod
    def _schema_at_least(conn: psycopg.Connection, version: int) -> bool:
        """Migration ``version`` is applied (readers such as the CLI and the UI never migrate)."""
        return conn.execute("SELECT coalesce(max(version), 0) >= %s FROM eos.schema_version",
                            (version,)).fetchone()[0]

    def load_claim(self, conn: psycopg.Connection, pipeline: str) -> Claim | None:
        """The pipeline's recorded claim; None if it has none (never planned,
        planned before claims were recorded, or released). One primary-key read."""
        row = conn.execute(f"SELECT {self._CLAIM_COLUMNS} FROM eos.pipelines p"
                           " WHERE pipeline = %s AND topics IS NOT NULL", (pipeline,)).fetchone()
        return None if row is None else _claim(row)

    def claims_on_target(self, conn: psycopg.Connection, target: str, place: str | None = None) -> list[Claim]:
        """Every pipeline claimed with this target id or, if given, this place
        (indexes pipelines_target, pipelines_target_place). Planners only: it
        needs migration 11."""
        rows = conn.execute(f"SELECT {self._CLAIM_COLUMNS} FROM eos.pipelines p WHERE target = %s"
                            " OR (%s::text IS NOT NULL AND target_place = %s) ORDER BY pipeline",
                            (target, place, place)).fetchall()
        return [_claim(r) for r in rows]

    def lock_target(self, conn: psycopg.Connection, target: str) -> None:
        """Serialise claims of one target, so two pipelines claiming it at once
        see each other. Take it before ``lock_pipeline``. A hash collision only
        serialises two unrelated claims, which are rare and short."""
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_CLAIM_LOCK, target))

    def save_claim(self, conn: psycopg.Connection, claim: Claim) -> None:
        """Record the claim. Call under ``lock_pipeline`` (and ``lock_target``)."""
        conn.execute(
            "UPDATE eos.pipelines SET topics = %s, dag_id = %s, target = %s, target_exclusive = %s,"
            " target_place = %s, claimed_at = coalesce(claimed_at, now()) WHERE pipeline = %s",
            (list(claim.topics), claim.dag_id, claim.target, claim.target_exclusive, claim.place, claim.pipeline),
        )

    def release(self, conn: psycopg.Connection, pipeline: str) -> Claim | None:
        """Forget the pipeline's claim (its windows, cuts and offsets stay); the
        next plan claims it again. Returns the claim released, None if there was
        none."""
        conn.execute("SELECT 1 FROM eos.pipelines WHERE pipeline = %s FOR UPDATE", (pipeline,))
        claim = self.load_claim(conn, pipeline)
        conn.execute("UPDATE eos.pipelines SET topics = NULL, dag_id = NULL, target = NULL,"
                     " target_exclusive = false, claimed_at = NULL WHERE pipeline = %s", (pipeline,))
        if self._schema_at_least(conn, 11):
            conn.execute("UPDATE eos.pipelines SET target_place = NULL WHERE pipeline = %s", (pipeline,))
        return claim

    def overlapping_windows(self, conn: psycopg.Connection, window: Window) -> list[tuple[datetime, datetime]]:
        return conn.execute(
            "SELECT window_start, window_end FROM eos.windows"
            " WHERE pipeline = %s AND window_start < %s AND window_end > %s ORDER BY window_start",
            (window.pipeline, window.end, window.start),
        ).fetchall()

    def freeze(self, conn: psycopg.Connection, plan: WindowPlan, new_cuts: list[Cut]) -> None:
        """Store new cuts and the window's plan. Call under ``lock_pipeline``."""
        w = plan.window
        with conn.cursor() as cur:
            cur.executemany(
                'INSERT INTO eos.cuts (pipeline, topic, partition, at, "offset", how) VALUES (%s, %s, %s, %s, %s, %s)',
                [(w.pipeline, c.tp.topic, c.tp.partition, c.at, c.offset, c.how) for c in new_cuts],
            )
            cur.execute(
                "INSERT INTO eos.windows (pipeline, window_start, window_end, reader_schema) VALUES (%s, %s, %s, %s)",
                (w.pipeline, w.start, w.end, plan.reader_schema),
            )
            cur.executemany(
                "INSERT INTO eos.window_ranges (pipeline, window_start, topic, partition, start_offset, end_offset)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [(w.pipeline, w.start, r.topic, r.partition, r.start_offset, r.end_offset) for r in plan.ranges],
            )
