"""FileSink: windows published as Parquet partition directories by the
temp-directory-then-rename two-phase commit.

A file system has no transactions, so the ledger (schema ``eos``) stays in
PostgreSQL and the commit is a classic two-phase commit: one ledger transaction
is the *decision*; moving the files into place follows it, is idempotent, and is
finished by whoever comes next. In the order of a window's life:

- **begin** opens an attempt (new epoch: older attempts are fenced) and creates
  its staging directory ``<root>/_eos_staging/<attempt.staging>/`` (see
  :mod:`~airflow_eos.targets.files.writer` for what is inside).
- **write** (Spark tasks, or :class:`~airflow_eos.targets.files.writer.FileWriter`)
  puts Parquet files into the staging's ``data/``, dead letters into
  ``dead_letters/``; a file appears under its name only once complete.
- **checkpoint + seal** (the job commit, one ledger transaction): the seal
  reads every staged file's Parquet footer, checks each checkpointed chunk holds
  what its task counted, moves exactly the checkpointed files into ``publish/``
  and ``sealed_dead_letters/`` (where no writer writes), and records the
  manifest (file, size, rows) in ``eos.staged_files``.
- **prepare** (the sensor): every manifest file is there with its size and rows.
- **commit**: the decision, then the publication (see :meth:`FileSink.commit`).
- **abort** marks the attempt aborted, then deletes its staging directory.

Readers (Spark, Hive, PyArrow, DuckDB) skip names that start with ``_`` or
``.``: ``_eos_staging``, ``_eos_trash`` and each partition's ``_eos_commit.json``
are invisible to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_eos.core.ledger import Ledger
from airflow_eos.core.publication import PublishedAfterDecision
from airflow_eos.core.sink import Sink
from airflow_eos.core.staged_files import ManifestFile
from airflow_eos.targets.files.abort import FileAbort
from airflow_eos.targets.files.commit import (
    COMMIT_FORMAT,
    COMPLETE,
    DECIDED,
    EXCHANGED,
    PUBLISHED_STATE,
    RENAMED,
    SUPERSEDED,
    SUPERSEDED_HOW,
    FileCommit,
)
from airflow_eos.targets.files.identity import root_aliases, root_id
from airflow_eos.targets.files.layout import DEFAULT_LAYOUT, DEFAULT_REPLACED_RETENTION
from airflow_eos.targets.files.published import LINEAGE_COLUMNS, FilePublished
from airflow_eos.targets.files.staging import FileStaging
from airflow_eos.targets.files.storage import Files, files_for

__all__ = ["COMMIT_FORMAT", "COMPLETE", "DECIDED", "EXCHANGED", "LINEAGE_COLUMNS", "PUBLISHED_STATE", "RENAMED",
           "SUPERSEDED", "SUPERSEDED_HOW", "FileSink", "ManifestFile"]


@dataclass(frozen=True)
class FileSink(FileStaging, FileCommit, FileAbort, FilePublished, PublishedAfterDecision, Sink):
    """The runtime sink of a bound :class:`~airflow_eos.targets.files.FileTarget`.

    Its parts, one module each: :mod:`~airflow_eos.targets.files.staging`
    (where things are, begin, the writers, seal, prepare),
    :mod:`~airflow_eos.targets.files.commit` (the decision and the
    publication; :mod:`airflow_eos.core.publication` publishes after the
    decision and finishes decided publications), :mod:`~airflow_eos.targets.files.abort` (abort, teardown,
    sweep), :mod:`~airflow_eos.targets.files.published` (what verify reads).
    """

    root: str
    ledger_url: str = field(repr=False)
    layout: str = DEFAULT_LAYOUT
    on_committed: str = "skip"
    format: str = "parquet"
    replaced_retention_s: float = DEFAULT_REPLACED_RETENTION.total_seconds()

    @property
    def files(self) -> Files:
        return files_for(self.root)

    @property
    def ledger(self) -> Ledger:  # type: ignore[override]
        return Ledger(self.ledger_url)

    @property
    def target_id(self) -> str:
        return root_id(self.root)

    @property
    def target_aliases(self) -> tuple[str, ...]:
        return root_aliases(self.root)

    @property
    def target_ids(self) -> list[str]:
        """Every id this root's publications may be recorded under (eos.publications.target)."""
        return [self.target_id, *self.target_aliases]

    @property
    def replaces_committed(self) -> bool:
        return self.on_committed == "replace"

    @property
    def label(self) -> str:
        return self.root
