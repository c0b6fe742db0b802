"""The two-phase-commit sink interface, in the spirit of Flink's Sink V2
(``org.apache.flink.api.connector.sink2``: a writer that stages, a committer
whose commit is idempotent).

A window's life through a sink (airflow_eos/steps.py calls these)::

    attempt = sink.begin(window)          # stage: new epoch (fences older attempts), staging
    writer = sink.writer(attempt)         # picklable; used inside Spark tasks
    sink.checkpoint(attempt, consumed, chunks)   # Spark job commit
    sink.prepare(attempt)                 # await_checkpoint: the barrier
    sink.commit(attempt)                  # idempotent; says what it did
    sink.abort(attempt, reason)           # or abort_window / sweep

The target-independent protocol lives in the core: epochs, checkpoints,
prepare's checks and ledger states in :mod:`airflow_eos.core.attempt`, the
commit and abort sequences in :mod:`airflow_eos.core.commit`. A sink is the
small roles of :mod:`airflow_eos.core.roles` together: it supplies its
staging, its writer, a count of what is staged, and the committer hooks
(:class:`~airflow_eos.core.commit.Committer`) that make its publication
atomic. A target's serialisable spec (core/target.py) builds its sink.

The contract every sink keeps, whatever Airflow does (retries, clears, zombies):

- **Fencing.** ``begin`` makes the new attempt the window's only committable one;
  every method that moves an attempt forward (checkpoint, prepare, commit)
  refuses an attempt that a newer one fenced, inside the same ledger
  transaction that would move it.
- **Nothing published without a decision.** The window becomes committed in the
  ledger, with the pipeline's offsets, in one transaction; no row, file or
  record becomes visible to readers of the target before that transaction
  commits, and none of an attempt that never commits.
- **Idempotent commit.** ``commit`` may be called any number of times, by any
  process, concurrently, after a crash at any point inside it: the target ends
  up holding the window's rows exactly once, and each call says what it did
  (:class:`CommitOutcome`). A commit that was decided but whose publishing did
  not finish (a target without transactions) is finished by the next call.
- **Abort is safe at any time.** ``abort`` of a committed attempt does nothing;
  of a live one, it drops its staging. It never touches published data.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

# The commit's outcome and result, importable from here as before the protocol had a module of its own.
from airflow_eos.core.commit import (  # noqa: F401
    ALREADY_COMMITTED,
    PUBLISHED,
    REPLACED,
    SKIPPED,
    CommitOutcome,
    CommitResult,
    Committer,
)
from airflow_eos.core.errors import TargetError
from airflow_eos.core.roles import (  # noqa: F401 - SparkOutput and ForeignRecord: importable from here
    Audited,
    Checkpointer,
    ForeignRecord,
    Preparer,
    SparkOutput,
    SparkWriting,
    Stager,
    Sweeper,
    TaskWriting,
)

# The columns (and Spark types) of a dead letter written as Parquet: its source
# record, the error, and the raw record.
DEAD_LETTER_SCHEMA = (("topic", "string"), ("partition", "int"), ("offset", "long"), ("error", "string"),
                       ("key", "binary"), ("value", "binary"))


def dead_letters_as_rows(dead_letters: Iterable) -> Iterator[tuple]:
    """(topic, partition, offset, error, key, value) for each dead letter a
    writer is given (Arrow batches or tables of DEAD_LETTER_SCHEMA's columns,
    or mappings); one without its source record or its error raises TargetError:
    a dead letter must trace to its record."""
    for item in dead_letters:
        records = [item] if isinstance(item, Mapping) else item.to_pylist()
        for r in records:
            missing = [k for k in ("topic", "partition", "offset", "error") if r.get(k) is None]
            if missing:
                raise TargetError(f"dead letter {r!r} lacks {missing}")
            yield (r["topic"], int(r["partition"]), int(r["offset"]), str(r["error"]), r.get("key"), r.get("value"))


class Sink(Stager, TaskWriting, SparkWriting, Checkpointer, Preparer, Sweeper, Audited):
    """A two-phase-commit target: every role of :mod:`airflow_eos.core.roles`
    (and so the :class:`~airflow_eos.core.commit.Committer`). Subclasses keep
    the ledger in ``self.ledger``; each role's docstring says its contract."""
