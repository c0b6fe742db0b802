"""Runs a pipeline's windows as DAG runs: each step in-process (its ``raise`` faults
injected in its thread), or in a forked child with EOS_FAULTS when its window has a
``crash`` fault at the step's points; retries, clears,
backfills, the teardown, the sweep; zombie attempts.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_eos import steps
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.faults import ENV as FAULTS_ENV
from airflow_eos.core.faults import STATE_ENV as FAULTS_STATE_ENV
from airflow_eos.core.faults import injected
from airflow_eos.core.windows import WindowPlan
from harness.chaos.pipeline import (
    POINT_STEPS,
    STEPS,
    TEARDOWN,
    Pipeline,
    abort_step,
    await_step,
    commit_step,
    plan_step,
    stage_attempt,
    stage_step,
)
from harness.chaos.source import batch_transform, spark_transform

log = logging.getLogger(__name__)

STEP_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- running a step with faults


class StepFailed(Exception):
    """A step failed: raised (``crashed`` False) or its process died (True)."""

    def __init__(self, message: str, *, crashed: bool = False, error: str | None = None):
        super().__init__(message)
        self.crashed = crashed
        self.error = error  # the exception's class name, when it raised


_ctx_lock = threading.Lock()
_ctx: Any = None


def _context():
    """A fork server that imported this module before any thread existed: fork
    is cheap and safe (no librdkafka thread or lock is copied mid-use)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            # What the children would each import again otherwise: pandas (pyarrow imports it on its
            # first conversion, ~3 s); the Iceberg target's catalog and file IO (~0.9 CPU-s: a forked
            # child of an Iceberg case spent most of its CPU importing them); the Avro source's registry
            # client (~0.2 CPU-s). Imported once, in the fork server, ~1.1 CPU-s more per test worker.
            ctx.set_forkserver_preload([__package__ or "harness.chaos", "airflow_eos.spark.kafka_source", "pandas",
                                       "pyarrow.pandas_compat", "pyiceberg.catalog.sql", "pyiceberg.io.pyarrow",
                                       "sqlalchemy.dialects.postgresql.psycopg",
                                       "confluent_kafka.schema_registry"])
            _ctx = ctx
        return _ctx


def _child(conn, faults: str, state_dir: str, fn: Callable, args: tuple) -> None:
    os.environ[FAULTS_ENV] = faults
    os.environ[FAULTS_STATE_ENV] = state_dir
    try:
        value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - everything goes to the parent
        conn.send(("error", type(exc).__name__, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    else:
        conn.send(("ok", value))
    conn.close()


def run_step(fn: Callable, *args, faults: str = "", state_dir: str | os.PathLike | None = None) -> Any:
    """``fn(*args)`` with the faults ``faults``: in-process when none of them
    crashes (a ``raise`` fires in the calling thread only:
    airflow_eos.core.faults.injected), else in a child with EOS_FAULTS=faults,
    so that a crash ends a process of its own. Raises StepFailed when it fails
    or its process dies."""
    if not crashes(faults):
        try:
            with injected(faults, state_dir):
                return fn(*args)
        except Exception as exc:
            # Not chained: the traceback's frames (connections, consumers, a
            # half-read generator) are freed now, as a failed task's process ends.
            failed = StepFailed(f"{type(exc).__name__}: {exc}", error=type(exc).__name__)
        raise failed
    ctx = _context()
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, faults, str(state_dir), fn, args), daemon=True)
    proc.start()
    sender.close()
    try:
        message = receiver.recv() if receiver.poll(STEP_TIMEOUT_S) else ("timeout",)
    except EOFError:  # the child died before answering
        message = None
    finally:
        receiver.close()
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join(10)
    if message is None:
        raise StepFailed(f"process died with exit code {proc.exitcode}", crashed=True)
    if message[0] == "ok":
        return message[1]
    if message[0] == "timeout":
        raise StepFailed(f"step did not finish within {STEP_TIMEOUT_S}s")
    raise StepFailed(message[2], error=message[1])


def crashes(faults: str) -> bool:
    """Whether a fault spec (EOS_FAULTS syntax) has a ``crash``: a step with one needs a process of its own."""
    return any(item.partition("=")[2].partition("*")[0].strip() == "crash" for item in faults.split(","))


def faults_for(spec: str, step: str, state_dir: Path | None = None) -> str:
    """The part of a fault spec that can fire in ``step``: without the faults
    whose every firing (``point=action*N``) is claimed in ``state_dir``
    already, which can fire no more. A step with no crash left runs
    in-process: most of a schedule's steps, as a child process costs seconds
    on a busy machine."""
    items = [item.strip() for item in spec.split(",") if item.strip()]
    return ",".join(i for i in items if step in POINT_STEPS[i.partition("=")[0]]
                    and not (state_dir is not None and _spent(i, state_dir)))


def _spent(item: str, state_dir: Path) -> bool:
    """Whether every firing of ``point=action*N`` is claimed (airflow_eos.core.faults._claim)."""
    point, _, action = item.partition("=")
    _, _, times = action.partition("*")
    return bool(times) and all((state_dir / f"{point}.{n}").exists() for n in range(int(times)))


class SparkStager:
    """The stage step through the real Spark job (run_stage) in a shared
    SparkSession. Faults reach Spark's Python workers (where the write tasks,
    the job commit and the job abort run) through the SparkContext's
    environment, which run_stage's registration of the data sources captures;
    a ``crash`` kills a Python worker, as an executor lost mid-task. One stage
    at a time: the environment is the session's."""

    def __init__(self, spark):
        self.spark = spark
        self.lock = threading.Lock()

    def __call__(self, p: Pipeline, plan_dict: dict, faults: str, state_dir: Path) -> dict:
        from airflow_eos.spark.stage import register, run_stage

        plan = WindowPlan.from_dict(plan_dict)
        env = self.spark.sparkContext.environment

        def job(attempt: Attempt) -> dict:
            return run_stage(self.spark, plan, attempt, p.target, dict(p.kafka_config), spark_transform,
                             max_records_per_task=p.max_records_per_task, max_bad_records=1_000_000).to_dict()

        with self.lock:
            if faults:
                env[FAULTS_ENV], env[FAULTS_STATE_ENV] = faults, str(state_dir)
            try:
                return steps.stage(p.target, plan, job).to_dict()
            finally:
                env.pop(FAULTS_ENV, None)
                env.pop(FAULTS_STATE_ENV, None)
                register(self.spark)  # drop the faults from the registered data sources


# --------------------------------------------------------------------------- DAG runs of windows


@dataclass
class RunOutcome:
    window: int
    state: str  # success | failed
    failed_step: str | None
    tries: list[tuple[str, str]]  # (step, ok | raised: ... | crashed)
    summary: dict | None = None  # the commit's XCom, the Asset event's extra


@dataclass
class Harness:
    """Runs windows of one pipeline as DAG runs, with faults per window, and
    records what happened for the failure message."""

    pipeline: Pipeline
    state_root: Path
    faults: dict[int, str] = field(default_factory=dict)  # window -> EOS_FAULTS spec
    retries: int = 0
    events: list[str] = field(default_factory=list)
    asset_events: dict[int, list[dict]] = field(default_factory=dict)
    runs: int = 0
    # The stage step: None for the Python stage job (in a child when faulted),
    # or a callable (pipeline, plan dict, faults, state dir) -> attempt dict,
    # e.g. SparkStager.
    stager: Callable[[Pipeline, dict, str, Path], dict] | None = None
    # A window whose commit step the other windows' commits wait for (None: no order): a decided
    # window's publication is finished by whichever commit of the pipeline comes first
    # (core/publication.py), so only this order makes a fault inside it fire in its own process.
    commits_after: int | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._first_commit_done = threading.Event()
        if self.commits_after is None:
            self._first_commit_done.set()

    def note(self, text: str) -> None:
        with self._lock:
            self.events.append(f"{time.monotonic() - self._started:7.2f}s {text}")

    def _step(self, i: int, step: str, fn: Callable, *args) -> Any:
        state_dir = self.state_root / f"w{i}"
        faults = faults_for(self.faults.get(i, ""), step, state_dir)
        return run_step(fn, self.pipeline, *args, faults=faults, state_dir=state_dir)

    def _stage(self, i: int, plan: dict) -> dict:
        if self.stager is None:
            return self._step(i, "stage", stage_step, plan)
        try:
            state_dir = self.state_root / f"w{i}"
            return self.stager(self.pipeline, plan, faults_for(self.faults.get(i, ""), "stage", state_dir), state_dir)
        except Exception as exc:
            raise StepFailed(f"{type(exc).__name__}: {exc}", error=getattr(exc, "error", None)
                             or type(exc).__name__) from exc

    def run(self, i: int, *, retries: int | None = None) -> RunOutcome:
        """One DAG run of window ``i`` (a first run or a clear of the task group)."""
        retries = self.retries if retries is None else retries
        window = self.pipeline.window(i)
        outcome = RunOutcome(i, "success", None, [])
        with self._lock:
            self.runs += 1
        xcom: dict[str, Any] = {}
        calls = {
            "plan": lambda: self._step(i, "plan", plan_step, window),
            "stage": lambda: self._stage(i, xcom["plan"]),
            "await_checkpoint": lambda: self._step(i, "await_checkpoint", await_step, xcom["stage"]),
            "commit": lambda: self._step(i, "commit", commit_step, xcom["stage"]),
        }
        try:
            for step in STEPS:
                if step in ("await_checkpoint", "commit") and xcom["stage"]["epoch"] is None:
                    outcome.tries.append((step, "skipped"))  # committed already, the target skips reruns
                    continue
                if step == "commit" and i != self.commits_after and not self._first_commit_done.wait(600):
                    raise AssertionError(f"w{i}: window {self.commits_after}'s commit did not end in 600 s")
                if not self._try(i, step, calls[step], retries, outcome, xcom):
                    outcome.state, outcome.failed_step = "failed", step
                    break
        finally:
            if i == self.commits_after:  # its commit ended, or its run ended before one
                self._first_commit_done.set()
        if "plan" in xcom:  # the teardown runs when its setup succeeded
            self._try(i, TEARDOWN, lambda: self._step(i, "abort", abort_step, window), retries, outcome, xcom)
        if outcome.state == "success" and "commit" in xcom:
            outcome.summary = xcom["commit"]
            if xcom["commit"]["announce"]:  # as the commit task: an Asset event only for an unannounced change
                with self._lock:
                    self.asset_events.setdefault(i, []).append(xcom["commit"])
        elif outcome.state == "success":  # a skipped commit: its summary is the stage's, and no Asset event
            outcome.summary = xcom["stage"]
        self.note(f"w{i} run {outcome.state}: " + ", ".join(f"{s} {r}" for s, r in outcome.tries))
        return outcome

    def _try(self, i, step, call, retries, outcome, xcom) -> bool:
        for _ in range(retries + 1):
            try:
                xcom[step] = call()
            except StepFailed as exc:
                outcome.tries.append((step, "crashed" if exc.crashed else f"raised {exc.error}"))
                if not exc.crashed and exc.error != "FaultInjected":  # not the test's own fault: say what it was
                    self.note(f"w{i} {step}: {str(exc)[:400]}")
                continue
            outcome.tries.append((step, "ok"))
            return True
        return False

    def emitted(self, i: int, outcome: str) -> None:
        """A commit made by the test itself (as a commit task would): its Asset event."""
        with self._lock:
            self.asset_events.setdefault(i, []).append({"outcome": outcome})

    # ---------------------------------------------------------------- recoveries

    def run_until_committed(self, order: Sequence[int], *, max_rounds: int = 20,
                            parallel: int = 1, rng: random.Random | None = None) -> int:
        """Run the windows (in ``order``), then clear the failed ones, round after
        round, until all are committed. Returns the rounds it took."""
        pending = list(order)
        for round_ in range(1, max_rounds + 1):
            outcomes = self.run_many(pending, parallel=parallel)
            pending = [o.window for o in outcomes if o.state != "success"]
            if not pending:
                return round_
            if rng is not None:
                rng.shuffle(pending)
        raise AssertionError(f"windows {pending} still not committed after {max_rounds} rounds")

    def run_many(self, order: Sequence[int], *, parallel: int = 1) -> list[RunOutcome]:
        if parallel <= 1 or len(order) <= 1:
            return [self.run(i) for i in order]
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            return list(pool.map(self.run, order))

    def sweep(self) -> list[int]:
        swept = self.pipeline.target.sweep(timedelta(0))
        mine = [a.epoch for a in swept if a.pipeline == self.pipeline.name]
        self.note(f"sweep aborted {len(swept)} attempt(s)")
        return mine

    def faults_fired(self) -> Counter:
        """fault point -> times it fired in this harness's runs: the firings of a
        ``point=action*N`` fault are claimed as files ``point.k`` in the
        window's state directory (airflow_eos.core.faults)."""
        fired: Counter = Counter()
        for claim in self.state_root.glob("w*/*.*"):
            point, _, n = claim.name.rpartition(".")
            if n.isdigit():
                fired[point] += 1
        return fired

    def history(self) -> str:
        return "\n".join(self.events)


# --------------------------------------------------------------------------- zombies


class Zombie:
    """A stage attempt left running: it opens its attempt and stages part of the
    window now, and finishes (stages the rest, checkpoints, prepares, commits)
    whenever told, typically after newer attempts committed the window. It must
    never make a row visible twice; being fenced or closed is its expected fate."""

    EXPECTED = ("AttemptFenced", "AttemptClosed", "TargetError", "NotPrepared", "WindowNotPlanned")

    def __init__(self, p: Pipeline, i: int):
        self.p, self.i = p, i
        plan = WindowPlan.from_dict(plan_step(p, p.window(i)))
        self.plan = plan
        self.attempt = p.target.begin(plan.window)
        writer = p.target.writer(self.attempt)
        # Half the records, as one write task that committed its chunk.
        batches = []
        from airflow_eos.spark.kafka_source import plan_tasks, read_range

        task = plan_tasks(plan, p.max_records_per_task)[0]
        transform = batch_transform(p.avro, plan.reader_schema)
        for raw in read_range(p.kafka_config, task, batch_rows=p.batch_rows, end_grace_s=0.5, poll_timeout_s=20):
            batches.append(transform(raw)[0])
        self.first_chunk = writer.write(batches)

    def finish(self) -> str:
        """Run the rest of the attempt's life; returns how it ended."""
        target = self.p.target
        try:
            stage_attempt(self.p, self.plan, self.attempt)
            if not target.prepare(self.attempt).prepared:
                return "not prepared"
            return f"committed: {target.commit(self.attempt).outcome}"
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            name = type(exc).__name__
            if name not in self.EXPECTED:
                raise
            return f"refused: {name}"


