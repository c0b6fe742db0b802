"""Steps 2–5 of a window's life as far as they do not depend on the target:
open an attempt (fencing every older one), record its checkpoint, prove it
complete (prepare), mark it committed with the pipeline's offsets, or abort it.

An *attempt* is one execution of the stage step for a window. Opening one bumps
the window's epoch; only the attempt holding the current epoch can be
checkpointed, prepared or committed, like a Kafka producer epoch fencing zombie
producers. An older attempt may still be writing its staging (a zombie Spark job),
which is harmless: its rows are never published.

What an attempt staged is its *checkpoint* (core/checkpoint.py: what it
consumed, the chunks it staged), written here once its job committed and proved
against the plan and the staging by prepare.

The functions that take a connection run inside the caller's transaction, so
that a target sharing the ledger's database (PostgresTarget) can make each step
and its own staging work one atomic change.

The package's modules: ``model`` (the states, Attempt, AttemptStatus),
``rows`` (open, read, list and abort attempts), ``checkpoints`` (record and
read a checkpoint and the read tasks' reports), ``prepare`` and
``committed`` (mark it committed, advance the offsets). Import the names from
here; what an attempt staged (core/checkpoint.py) is part of this interface.
"""

from airflow_eos.core.attempt.checkpoints import (
    load_checkpoint,
    load_read_ranges,
    record_read_range,
    record_staged_chunks,
    write_checkpoint,
)
from airflow_eos.core.attempt.committed import advance_offsets, check_committable, load_offsets, mark_committed
from airflow_eos.core.attempt.model import (
    ABORTED,
    CHECKPOINTED,
    COMMITTED,
    LIVE,
    OPEN,
    PREPARED,
    Attempt,
    AttemptState,
    AttemptStatus,
    check_current,
    staging_name,
)
from airflow_eos.core.attempt.prepare import Readiness, prepare
from airflow_eos.core.attempt.rows import (
    aborted_attempts,
    attempt_counts,
    live_attempts,
    load_state,
    load_status,
    mark_aborted,
    open_attempt,
    stale_attempts,
)
from airflow_eos.core.checkpoint import (
    Checkpoint,
    ConsumedRange,
    StagedChunk,
    chunk_problems,
    combine_checksums,
    coverage_problems,
    make_checkpoint,
)

__all__ = [
    "ABORTED", "CHECKPOINTED", "COMMITTED", "LIVE", "OPEN", "PREPARED",
    "Attempt", "AttemptState", "AttemptStatus", "Checkpoint", "ConsumedRange", "Readiness", "StagedChunk",
    "aborted_attempts", "advance_offsets", "attempt_counts", "check_committable", "check_current", "chunk_problems", "combine_checksums",
    "coverage_problems", "live_attempts", "load_checkpoint", "load_offsets", "load_read_ranges", "load_state",
    "load_status", "make_checkpoint", "mark_aborted", "mark_committed", "open_attempt", "prepare",
    "record_read_range", "record_staged_chunks", "stale_attempts", "staging_name", "write_checkpoint",
]
