"""The Iceberg target's part of the commit protocol (:mod:`airflow_eos.core.commit`)
and its publication after the decision (:mod:`airflow_eos.core.publication`):
the table's commit of exactly the manifest's files in one snapshot whose
summary carries the window and the commit token. A mixin of
:class:`~airflow_eos.targets.iceberg.sink.IcebergSink`.

Idempotent as Iceberg's Flink committer is, and more: the token is the
window's (pipeline, window, epoch, decision), not a job's, so a retried
commit, a later commit of the pipeline, a Clear or the sweep, in any process
or job, finds it in the table's history and does nothing (``already``);
where that history has expired, by the window's data files (table.py). A
concurrent writer's commit makes ours fail; it is tried again on the table
as loaded anew, after looking for the token again.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from airflow_eos.core.attempt import Attempt, AttemptStatus, Checkpoint
from airflow_eos.core.columns import DEAD_LETTER_COLUMNS
from airflow_eos.core.commit import Published, Settlement
from airflow_eos.core.errors import TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.publication import SUPERSEDED_HOW
from airflow_eos.core.staged_files import ManifestFile, dead_letter_records, load_manifest
from airflow_eos.targets.iceberg import table as tables
from airflow_eos.targets.iceberg.staging import IcebergStaging
from airflow_eos.targets.iceberg.writer import DEAD_LETTERS, ROWS

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# How a decided window reached the table (IcebergSink.publish).
APPENDED = "appended"  # one append snapshot: the window's files
OVERWRITTEN = "overwritten"  # one overwrite snapshot: the window's older files out, its new ones in (replace)
ALREADY = "already"  # the table had the window's commit: a retry after a crash, or a concurrent publisher
EMPTY = "empty"  # the window has no rows, and no older rows to replace: no snapshot
COMMIT_TRIES = 20  # commits lost to concurrent writers before giving up (the next commit or the sweep goes on)


class IcebergCommit(IcebergStaging):
    """The committer hooks of an IcebergSink and the table's commit."""

    fresh_publications = frozenset({APPENDED, OVERWRITTEN})

    def publish_in_decision(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint,
                            replacing: AttemptStatus | None, settlement: Settlement) -> Published:
        """The decision's part: the dead letters into ``eos.dead_letters`` (a
        replace deletes the window's older ones), the publication recorded as
        *decided*. Nothing is in the table yet: :meth:`publish_decided`
        commits the snapshot once the decision is durable."""
        manifest = load_manifest(conn, attempt)
        dead = self._read_dead_letters(attempt, manifest)
        fault_point("commit.before_publish")
        self.record_dead_letters(conn, attempt, dead, replacing is not None)
        self.record_decision(conn, attempt, self.table_name, None,
                             replacing.committed_epoch if replacing is not None else None)
        replaced = (replacing.published_rows or 0) if replacing is not None else 0
        return Published(checkpoint.row_count, len(dead), replaced)

    def _read_dead_letters(self, attempt: Attempt, manifest: list[ManifestFile]) -> list[tuple]:
        return [record for m in manifest if m.kind == "dead_letters"
                for record in dead_letter_records(
                    self.store.read_table(f"{self.attempt_url(attempt)}/{m.path}", list(DEAD_LETTER_COLUMNS)))]

    def discard(self, attempt: Attempt, conn: psycopg.Connection | None = None) -> None:
        """Delete an aborted (never decided) attempt's folder: no snapshot names its files."""
        self.store.delete_tree(self.attempt_url(attempt))

    def publication_place(self, attempt: Attempt) -> str:
        return self.label

    # ------------------------------------------------------------------ the table's commit

    def publish_decided(self, conn: psycopg.Connection, attempt: Attempt, location: str) -> str:
        """Commit the decided attempt's files into the table (see the module),
        holding the window's row lock; the ledger marks it published after."""
        decided_at = conn.execute("SELECT decided_at FROM eos.publications WHERE pipeline = %s AND window_start = %s"
                                  " AND epoch = %s", (attempt.pipeline, attempt.window_start, attempt.epoch)
                                  ).fetchone()[0]
        paths = self.data_paths(attempt, load_manifest(conn, attempt))
        older = self._older_paths(conn, attempt)
        token = tables.commit_token(attempt.staging, decided_at)
        base = self._intent(attempt, token)
        for tries in range(1, COMMIT_TRIES + 1):
            from pyiceberg.exceptions import CommitFailedException

            table = tables.without_commit_retries(self.table())
            found = tables.find_commit(table, token, base, paths)
            if found is not None:
                log.info("%s: %s holds its commit already (%s %s)", attempt, self.label, found.how,
                         found.snapshot_id or "")
                return ALREADY
            try:
                how = self._commit(table, attempt, token, paths, older)
            except CommitFailedException as exc:
                log.info("%s: a concurrent writer committed to %s first (%s); loading it again, try %d of %d",
                         attempt, self.label, exc, tries + 1, COMMIT_TRIES)
                time.sleep(min(0.05 * 2 ** tries, 2.0))
                continue
            fault_point("commit.after_publish")  # the table has the snapshot; the ledger not yet told
            return how
        raise TargetError(f"{attempt}: {COMMIT_TRIES} commits into {self.label} lost to concurrent writers; the "
                          "window is decided, not yet published: a retry, the next commit or the sweep publishes it")

    def _intent(self, attempt: Attempt, token: str) -> int | None:
        """The table's snapshot when the window's publication first began
        (None: it had none), recorded once, durably, before any commit of the
        window: every commit of it is a descendant (table.find_commit)."""
        key = (attempt.pipeline, attempt.window_start, attempt.epoch)
        query = "SELECT base_snapshot FROM eos.iceberg_intents WHERE pipeline = %s AND window_start = %s AND epoch = %s"
        with self.ledger.connect() as conn, conn.transaction():
            row = conn.execute(query, key).fetchone()
        if row is not None:
            return row[0]
        base = tables.current_snapshot_id(self.table())
        with self.ledger.connect() as conn, conn.transaction():
            conn.execute("INSERT INTO eos.iceberg_intents (pipeline, window_start, epoch, target, token, base_snapshot)"
                         " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                         (*key, self.target_ids[0], token, base))
            return conn.execute(query, key).fetchone()[0]

    def _older_paths(self, conn: psycopg.Connection, attempt: Attempt) -> list[str]:
        """The data files of the window's other decided attempts: what a
        replace takes out of the table (those of them the table holds)."""
        rows = conn.execute(
            "SELECT a.staging_table, s.path FROM eos.staged_files s JOIN eos.publications p USING (pipeline,"
            " window_start, epoch) JOIN eos.attempts a USING (pipeline, window_start, epoch) WHERE s.pipeline = %s"
            " AND s.window_start = %s AND s.epoch <> %s AND s.kind = 'data'",
            (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchall()
        return [f"{self.attempt_url(staging)}/{path}" for staging, path in rows]

    def _commit(self, table, attempt: Attempt, token: str, paths: list[str], older: list[str]) -> str:
        from pyiceberg.io.pyarrow import parquet_files_to_data_files
        from pyiceberg.table import TableProperties

        replaced = tables.live_data_files(table, older)
        if not paths and not replaced:
            return EMPTY
        props = tables.summary_properties(attempt.pipeline, attempt.window_start, attempt.window_end, attempt.epoch,
                                          token)
        added = list(parquet_files_to_data_files(table.io, table.metadata, iter(paths)))
        tx = table.transaction()
        if table.metadata.name_mapping() is None:  # files without Iceberg field ids are read by their names
            tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                                 table.metadata.schema().name_mapping.model_dump_json()})
        producer = tx.update_snapshot(snapshot_properties=props)
        with (producer.overwrite() if replaced else producer.fast_append()) as snapshot:
            for data_file in replaced:
                snapshot.delete_data_file(data_file)
            for data_file in added:
                snapshot.append_data_file(data_file)
        tx.commit_transaction()
        how = OVERWRITTEN if replaced else APPENDED
        log.info("%s: %s %d file(s), %d rows into %s%s (token %s)", attempt, how, len(added),
                 tables.data_file_rows(added), self.label,
                 f", taking out {len(replaced)} file(s), {tables.data_file_rows(replaced)} rows" if replaced else "",
                 token)
        return how

    def after_publication(self, attempt: Attempt, how: str) -> None:
        """Delete what no snapshot names: the dead letters (in the ledger now)
        and files the manifest left out; a superseded attempt's whole folder
        if it never began publishing, or the table's history since its intent
        shows it never had its commit (else its files stay: an older snapshot
        may name them; Iceberg's own expiry and orphan-file removal are theirs)."""
        url = self.attempt_url(attempt)
        with self.ledger.connect() as conn, conn.transaction():
            manifest = load_manifest(conn, attempt)
            intent = conn.execute(
                "SELECT token, base_snapshot FROM eos.iceberg_intents WHERE pipeline = %s AND window_start = %s"
                " AND epoch = %s", (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchone()
        if how == SUPERSEDED_HOW:
            found, whole = (None, True) if intent is None else tables.in_history(self.table(), *intent)
            if found is None and whole:  # never in the table: no snapshot, old or current, names its files
                self.store.delete_tree(url)
                return
        named = {m.path for m in manifest if m.kind == "data"}
        for f in self.store.listing(f"{url}/{ROWS}"):
            if f"{ROWS}/{f.name}" not in named:
                self.store.delete_file(f"{url}/{ROWS}/{f.name}")
        self.store.delete_tree(f"{url}/{DEAD_LETTERS}")
