"""Many pipelines committing at once against one database (issue 22 part 6).

``run_load`` runs ``pipelines`` pipelines of ``windows`` hourly windows each,
all with their ledger in one database (the shared ``eos`` schema), through the
production steps (airflow_eos.steps, via harness.chaos: plan, stage with the
Spark job's Python stand-in, prepare, commit). Every window is one task of a
thread pool of ``workers`` threads, in the order (window, pipeline): at any
moment about ``workers`` windows of different pipelines — and neighbouring
windows of one pipeline — are planning, staging and committing together, as
20 DAGs with ``max_active_runs > 1`` would. The targets alternate between
PostgreSQL's ``replace_window`` (the commit is an ``INSERT … SELECT``) and
``partition_per_window`` (the commit attaches a partition: catalog locks).

The result holds each commit step's wall time (what the commit task waits:
lock waits included) and the target's own transaction seconds, and, per
pipeline, the verdict of :func:`harness.chaos.check` (every window committed,
verify against Kafka clean: each record once, none missing, nothing extra).
A window that fails (a deadlock is an error PostgreSQL raises) is not retried:
it is reported, and the load fails.

Used by tests/integration/test_load.py and bench/load.py.
"""

from __future__ import annotations

import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from airflow_eos.targets.postgres.names import PARTITION_PER_WINDOW
from harness import chaos

MODES = ("replace_window", PARTITION_PER_WINDOW)


@dataclass
class LoadResult:
    pipelines: int
    windows: int
    records_per_window: int
    workers: int
    seconds: float = 0.0
    commit_s: list[float] = field(default_factory=list)  # the commit step, wall time
    commit_tx_s: list[float] = field(default_factory=list)  # the target's commit transaction
    window_s: list[float] = field(default_factory=list)  # plan .. commit of one window
    failures: list[str] = field(default_factory=list)
    verdicts: dict[str, chaos.Verdict] = field(default_factory=dict)
    ledger_problems: list[str] = field(default_factory=list)

    @property
    def committed(self) -> int:
        return len(self.commit_s)

    def figures(self) -> dict:
        """The figures bench/load.py reports (results.json keys)."""
        return {
            "load_pipelines": self.pipelines,
            "load_windows_per_pipeline": self.windows,
            "load_records_per_window": self.records_per_window,
            "load_workers": self.workers,
            "load_windows_committed": self.committed,
            "load_seconds": round(self.seconds, 2),
            "load_commit_p50_s": round(percentile(self.commit_s, 50), 4),
            "load_commit_p95_s": round(percentile(self.commit_s, 95), 4),
            "load_commit_max_s": round(max(self.commit_s, default=0.0), 4),
            "load_commit_tx_p50_s": round(percentile(self.commit_tx_s, 50), 4),
            "load_commit_tx_p95_s": round(percentile(self.commit_tx_s, 95), 4),
            "load_window_p50_s": round(percentile(self.window_s, 50), 4),
            "load_window_p95_s": round(percentile(self.window_s, 95), 4),
            "load_failures": len(self.failures),
            "load_verified_records": sum(v.report.totals.kafka_records or 0 for v in self.verdicts.values()),
        }


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method: the median of an even list is
    the mean of its middle two); 0.0 for no values."""
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def load_source(bootstrap: str, windows: int, per_hour: int, partitions: int = 2) -> str:
    """One topic all pipelines read: ``windows`` hours of orders, closed."""
    topic = f"load-{uuid.uuid4().hex[:8]}"
    chaos.create_topic(bootstrap, topic, partitions)
    chaos.produce(bootstrap, topic, chaos.source_records(windows, per_hour, partitions))
    return topic


def load_pipelines(url: str, bootstrap: str, topic: str, n: int) -> list[chaos.Pipeline]:
    """``n`` pipelines over ``topic``, ledger and target tables in ``url``."""
    out = []
    run = uuid.uuid4().hex[:6]
    for k in range(n):
        mode = MODES[k % len(MODES)]
        name = f"load_{run}_{k:02d}"
        table = f"chaos.{name}"
        chaos.create_target_table(url, table, mode)
        out.append(chaos.Pipeline(name, url, table, {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 10},
                                  (topic,), mode=mode))
    return out


def run_load(url: str, bootstrap: str, state_root: Path, *, pipelines: int = 20, windows: int = 24,
             per_hour: int = 4, partitions: int = 2, workers: int = 20) -> LoadResult:
    """Run the load (see the module's doc) and check every pipeline."""
    topic = load_source(bootstrap, windows, per_hour, partitions)
    ps = load_pipelines(url, bootstrap, topic, pipelines)
    harnesses = {p.name: chaos.Harness(p, state_root / p.name) for p in ps}
    result = LoadResult(pipelines, windows, per_hour * partitions, workers)

    def one(task: tuple[int, chaos.Pipeline]) -> None:
        i, p = task
        h = harnesses[p.name]
        started = time.perf_counter()
        try:
            plan = chaos.plan_step(p, p.window(i))
            staged = chaos.stage_step(p, plan)
            chaos.await_step(p, staged)
            t0 = time.perf_counter()
            summary = chaos.commit_step(p, staged)
            commit_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - every failure is reported; the load then fails
            result.failures.append(f"{p.name} window {i}: {type(exc).__name__}: {exc}")
            h.note(f"w{i} failed: {type(exc).__name__}: {exc}")
            return
        h.runs += 1
        h.asset_events.setdefault(i, []).append(summary)
        h.note(f"w{i} {summary['outcome']} in {commit_s:.3f}s")
        if summary["outcome"] != "published":
            result.failures.append(f"{p.name} window {i}: commit outcome {summary['outcome']}, not published")
        result.commit_s.append(commit_s)
        result.commit_tx_s.append(summary["seconds"])
        result.window_s.append(time.perf_counter() - started)

    tasks = [(i, p) for i in range(windows) for p in ps]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, tasks))
    result.seconds = time.perf_counter() - started
    for p in ps:
        try:
            result.verdicts[p.name] = chaos.check(harnesses[p.name], range(windows))
        except AssertionError as exc:
            result.failures.append(f"{p.name}: {exc}")
    result.ledger_problems = ledger_problems(url, [p.name for p in ps], windows)
    return result


def ledger_problems(url: str, names: list[str], windows: int) -> list[str]:
    """The shared ledger, read once more: each pipeline holds exactly
    ``windows`` windows, all committed, each by exactly one attempt (nothing
    was retried, so a second attempt would be a doubled stage), and each
    attempt's published rows plus dead letters equal its checkpoint's records."""
    problems = []
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT w.pipeline, count(DISTINCT w.window_start), count(*) FILTER (WHERE w.state <> 'committed'),"
            " count(a.epoch), count(DISTINCT (a.window_start, a.epoch))"
            " FROM eos.windows w LEFT JOIN eos.attempts a USING (pipeline, window_start)"
            " WHERE w.pipeline = ANY(%s) GROUP BY w.pipeline", (names,)).fetchall()
    seen = {r[0]: r[1:] for r in rows}
    for name in names:
        n_windows, not_committed, n_attempts, distinct = seen.get(name, (0, 0, 0, 0))
        if n_windows != windows:
            problems.append(f"{name}: {n_windows} windows in the ledger, expected {windows}")
        if not_committed:
            problems.append(f"{name}: {not_committed} window row(s) not committed")
        if n_attempts != windows or distinct != windows:
            problems.append(f"{name}: {n_attempts} attempts for {windows} windows (one each expected)")
    return problems
