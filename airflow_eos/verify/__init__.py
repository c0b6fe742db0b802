"""``airflow-eos verify``: prove, against Kafka, what a pipeline published.

For every committed window the records actually present in its planned ranges
are read from Kafka (offsets have gaps — transaction markers, compaction — so the
offset width is never taken for a count) and compared with the target:

- record-level pipelines (the target keeps the lineage columns ``eos_topic``,
  ``eos_partition``, ``eos_offset``): each record is published exactly once in
  its window or is a dead letter of the window's committed attempt; no row
  without a record of its window; row counts equal the ledger's;
- aggregate pipelines (no lineage): each window's row count equals the ledger's,
  its dead letters are records of the window, and, given ``count_column``, the
  counts add up to the window's records;
- both: the committed attempt's checkpoint covers the plan and counted the
  records Kafka holds, and ``eos.partition_offsets`` equals the contiguous
  committed prefix, computed here again from windows and ranges;
- offsets of a committed range that retention has deleted since (before the
  partition's log start) are no longer checkable against the source: the
  report lists them (``not_checkable``), not as a violation; the window's rows
  there are still checked for duplicates, against its ranges and the ledger's
  counts, and the rest of its ranges against Kafka as usual;
- no partition is held: the last committed end cut of a partition is not on a
  record stamped more than ``max_timestamp_skew`` beyond its window's end with
  older records after it (a cut frozen so holds every later window at that
  offset until one ends after the record's timestamp; see core.plan).

Comparisons run in SQL over temp tables (Kafka offsets arrive by COPY), inside
one repeatable-read transaction, so a commit running meanwhile is either wholly
seen or not at all, and a million records cost seconds, not Python sets.

The audit reads the target through its sink (Sink.published_relation), so the
target of any sink that implements it can be verified. The package: ``report``
(what verify says), ``kafka`` (reading the records), ``audit`` (the comparisons'
SQL).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import psycopg

from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable
from airflow_eos.core.ledger import Ledger, redact
from airflow_eos.core.plan import DEFAULT_MAX_TIMESTAMP_SKEW
from airflow_eos.core.sink import Sink
from airflow_eos.core.source import PartitionLog
from airflow_eos.core.target import TargetSpec, legacy_target
from airflow_eos.verify.audit import _Audit
from airflow_eos.verify.ledger_checks import committed_prefix
from airflow_eos.verify.report import (
    CHECKPOINT,
    COUNT,
    DEAD_AND_PUBLISHED,
    DUPLICATE,
    EXTRA,
    FOREIGN,
    HELD,
    MISSING,
    MORE,
    OFFSETS,
    NotCheckable,
    SOURCE,
    UNPUBLISHED,
    Totals,
    VerifyReport,
    Violation,
    WindowAudit,
)

AUDIT_WORK_MEM = "256MB"


def verify(ledger: Ledger, kafka: PartitionLog | Mapping[str, Any], target: TargetSpec | Sink | str, pipeline: str,
           *, count_column: str | None = None, max_examples: int = 20, timeout: float = 10.0,
           max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW) -> VerifyReport:
    """Audit ``pipeline``'s rows in ``target`` against Kafka: a target spec
    (bound, or needing only the ledger's connection, which is then this
    ledger's), a Sink, or the name of a table in the ledger's database (as the
    CLI gives it).

    ``kafka`` is a confluent-kafka configuration (read with batched fetches:
    use it for large audits) or any PartitionLog, e.g. a KafkaLog. For an
    aggregate target, ``count_column`` names a column whose per-window sum plus
    the window's dead letters must equal its records. At most ``max_examples``
    violations of each kind are listed per window; the counts are exact.
    ``max_timestamp_skew`` is the pipeline's (see core.plan): how far beyond a
    window's end its end cut's record may be stamped before, with older records
    after it, the partition counts as held.

    Raises LedgerUnavailable, TargetError or ConfigurationError when the audit
    cannot run; every finding about the data is a Violation in the report.
    """
    started = time.monotonic()
    sink, label = _sink_of(target, ledger)
    with ledger.connect() as conn:
        # One snapshot for ledger and target: a commit running meanwhile is seen wholly or not at all.
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            # The audit's joins hash a million Kafka records against as many rows:
            # with the default work_mem (4 MB) they spill to disk in batches.
            conn.execute(f"SET LOCAL work_mem = '{AUDIT_WORK_MEM}'")
            audit = _Audit(conn, ledger, pipeline, label, sink, count_column, max_examples, max_timestamp_skew)
            audit.load()
            audit.read_kafka(kafka, timeout)
            audit.check()
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"verify lost the database {redact(ledger.url)}: {exc}") from exc
        finally:
            conn.rollback()
    report = audit.report
    report.seconds = time.monotonic() - started
    return report


def _sink_of(target: TargetSpec | Sink | str, ledger: Ledger) -> tuple[Sink, str]:
    """The sink whose published rows verify reads, and the target's name for messages."""
    if isinstance(target, str):  # a table in the ledger's database (core.target.LEGACY_KIND's)
        target = legacy_target(target)
    if isinstance(target, TargetSpec):
        # verify reads the target from the ledger's database: the ledger's connection is this ledger's.
        if any(ref.role == "ledger" for ref in target.connections()):
            target = target.bind({"ledger": ledger.url})
        if not target.bound:
            raise ConfigurationError(f"verify needs {target.label} bound to its connections "
                                     f"({', '.join(ref.conn_id for ref in target.connections())}): bind it first")
        return target.sink(), target.label
    if isinstance(target, Sink):
        return target, repr(target)
    raise ConfigurationError(f"verify takes a target spec, a Sink or a table name, not {type(target).__name__}")


__all__ = ["verify", "VerifyReport", "WindowAudit", "Totals", "Violation", "NotCheckable", "committed_prefix",
           "DUPLICATE", "DEAD_AND_PUBLISHED", "MISSING", "EXTRA", "COUNT", "CHECKPOINT", "OFFSETS", "SOURCE", "HELD",
           "MORE", "UNPUBLISHED", "FOREIGN"]
