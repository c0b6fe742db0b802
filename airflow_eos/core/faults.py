"""Named fault points, for proving the guarantee under failure.

The protocol calls ``fault_point("commit.after_publish")`` at the places where a
crash would hurt most. Nothing happens unless the environment variable
``EOS_FAULTS`` names that point; when unset, a call is one dict lookup.

    EOS_FAULTS="commit.after_publish=crash"          # every time
    EOS_FAULTS="stage.mid_write=raise*1,plan.after_freeze=raise"

Actions: ``raise`` raises FaultInjected (an ordinary failure: Airflow retries it,
Spark aborts the job), ``crash`` ends the process at once with exit code 137, as
SIGKILL or an OOM kill would: no ``finally``, no rollback, no abort. ``*N`` fires
the first N times only, counted across processes in the directory named by
``EOS_FAULTS_STATE`` (required with ``*N``), so "fail the first try, succeed on
the retry" works across Airflow tasks and Spark workers.

In-process, ``with injected(spec, state_dir):`` sets faults for the calling
thread only (a context variable, consulted before ``EOS_FAULTS``): tests run a
step's ``raise`` faults in its own thread, without a process of their own.
A ``crash`` injected so still ends the whole process: give those a process.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from airflow_eos.core.errors import ConfigurationError, EosError

ENV = "EOS_FAULTS"
STATE_ENV = "EOS_FAULTS_STATE"

POINTS = frozenset({
    "plan.after_freeze",  # cuts and plan frozen, plan task not finished
    "stage.mid_write",  # a Spark task has COPYed part of its rows, not committed them
    "stage.before_checkpoint",  # every task staged; the job commit has not written the checkpoint
    "checkpoint.before_prepare",  # checkpoint durable; the sensor has not marked the attempt prepared
    "commit.before_publish",  # commit transaction open, window locked, nothing published
    "commit.after_publish",  # rows published inside the open transaction, not committed
    "commit.after_commit",  # transaction committed; offsets not mirrored, Asset event not emitted
    # A target without transactions (the file target) commits in two phases:
    "commit.after_decision",  # the ledger decided (window committed), nothing moved into place yet
    "commit.after_rename",  # the files renamed into place, the ledger not yet told they are published
    "commit.before_cleanup",  # the ledger marked the publication published (or superseded); staging not cleaned up
    # The Kafka target runs its whole transaction in the commit task:
    "commit.mid_produce",  # half the window's records produced (flushed) in the open Kafka transaction
    "commit.after_kafka_commit",  # the Kafka transaction committed, the ledger not yet told
    "abort.inside",  # abort marked the attempt aborted, staging not dropped yet
})


class FaultInjected(EosError):
    """A failure injected on purpose at a named fault point."""


def _parse(spec: str, *, counted_in: str | None,
           to_count: str = f"set {STATE_ENV} to a directory") -> dict[str, tuple[str, int | None]]:
    faults = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, _, action = item.partition("=")
        action, _, times = action.partition("*")
        if point not in POINTS:
            raise ConfigurationError(f"{ENV}: unknown fault point {point!r}; known: {', '.join(sorted(POINTS))}")
        if action not in ("raise", "crash"):
            raise ConfigurationError(f"{ENV}: action of {point} must be 'raise' or 'crash', not {action!r}")
        if times and not counted_in:
            raise ConfigurationError(f"{ENV}: '{item}' counts firings; {to_count}")
        faults[point] = (action, int(times) if times else None)
    return faults


_cache: tuple[str, dict] = ("", {})
# (faults, state directory) injected for this thread by injected(); None: EOS_FAULTS decides.
_injected: contextvars.ContextVar[tuple[dict, str | None] | None] = contextvars.ContextVar(
    "eos_faults_injected", default=None)


@contextlib.contextmanager
def injected(spec: str, state_dir: str | os.PathLike | None = None) -> Iterator[None]:
    """Inside the block, the faults of the calling thread are ``spec`` (the
    syntax of ``EOS_FAULTS``, ``*N`` firings claimed in ``state_dir`` as
    across processes), whatever ``EOS_FAULTS`` says; other threads are not
    affected, and a thread started inside the block does not inherit them
    (it runs in a new context). ``spec`` empty: no faults in the block."""
    state = os.fspath(state_dir) if state_dir is not None else None
    token = _injected.set((_parse(spec, counted_in=state, to_count="pass injected(spec, state_dir)"), state))
    try:
        yield
    finally:
        _injected.reset(token)


def fault_point(point: str) -> None:
    global _cache
    local = _injected.get()
    if local is not None:
        faults, state = local
    else:
        spec = os.environ.get(ENV)
        if not spec:
            return
        if _cache[0] != spec:
            _cache = (spec, _parse(spec, counted_in=os.environ.get(STATE_ENV)))
        faults, state = _cache[1], os.environ.get(STATE_ENV)
    fault = faults.get(point)
    if fault is None:
        return
    action, times = fault
    if times is not None and not _claim(point, times, Path(state or "")):
        return
    if action == "crash":
        sys.stderr.write(f"airflow-eos: fault injected at {point}: crashing\n")
        sys.stderr.flush()
        os._exit(137)
    raise FaultInjected(f"fault injected at {point}")


def _claim(point: str, times: int, state: Path) -> bool:
    """Take one of the ``times`` firings of ``point``; False once all are taken.
    O_EXCL file creation makes this atomic across processes (and threads)."""
    state.mkdir(parents=True, exist_ok=True)
    for n in range(times):
        try:
            fd = os.open(state / f"{point}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        return True
    return False
