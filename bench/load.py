"""Load (issue 22 part 6): 20 pipelines x 24 windows each, committing
concurrently against one database (one shared ledger), through the production
steps with the Spark job's Python stand-in (tests/harness/load.py, the driver
tests/integration/test_load.py also runs). Small windows (8 records: the
figure is the commit's contention, not its throughput); 20 threads, one
window of each pipeline in flight at a time, neighbouring windows of a
pipeline overlapping. Every pipeline is verified against Kafka by lineage
after the run; a failed window (a deadlock, a lost or doubled window) fails
the bench.

Reported: the commit step's wall time (what a commit task waits, lock waits
included) median and p95 — ``load_commit_p50_s``, ``load_commit_p95_s`` —, the
target transaction's own seconds, and a window's plan-to-commit time. Also
the section of results.md that shows them.

    .venv/bin/python bench/load.py          # alone, on embedded services: prints the figures
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))

PIPELINES = 20
WINDOWS = 24
PER_HOUR = 4  # records per partition and hour (2 partitions: 8 records a window)


def measure_load(bootstrap: str, pg_admin_url: str, *, pipelines: int = PIPELINES, windows: int = WINDOWS) -> dict:
    """Run the load in a database of its own on the server at ``pg_admin_url``
    (dropped afterwards) and return its figures; ``load_problems`` lists what
    went wrong (a failed window, a pipeline whose verify is not clean, a
    doubled attempt): empty, or the run violated the guarantee."""
    import psycopg

    from airflow_eos.core.ledger import Ledger
    from harness.load import run_load

    name = f"eos_load_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{pg_admin_url.rpartition('/')[0]}/{name}"
    try:
        Ledger(url).migrate()
        with tempfile.TemporaryDirectory(prefix="eos-load-") as state:
            result = run_load(url, bootstrap, Path(state), pipelines=pipelines, windows=windows,
                              per_hour=PER_HOUR, workers=pipelines)
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    problems = result.failures + result.ledger_problems
    if result.committed != pipelines * windows:
        problems.insert(0, f"{result.committed} of {pipelines * windows} windows committed")
    figures = {**result.figures(), "load_problems": problems[:20]}
    if problems:  # reported in results.md, loudly, rather than losing the rest of the bench's figures
        print("load: VIOLATION\n  " + "\n  ".join(problems[:20]), file=sys.stderr, flush=True)
    print(f"load: {pipelines} pipelines x {windows} windows committed and verified in {figures['load_seconds']} s; "
          f"commit p50 {figures['load_commit_p50_s']} s, p95 {figures['load_commit_p95_s']} s", flush=True)
    return figures


def load_section(res: dict) -> str:
    """results.md's load section (nothing for a results.json without it)."""
    if "load_commit_p50_s" not in res:
        return ""
    return "".join([
        f"\n## Load: {res['load_pipelines']} pipelines x {res['load_windows_per_pipeline']} windows, one ledger\n\n",
        f"{res['load_pipelines']} pipelines (alternately `replace_window` and `partition_per_window` PostgreSQL "
        f"targets, a table each) of {res['load_windows_per_pipeline']} hourly windows "
        f"({res['load_records_per_window']} records each) over one topic, their ledger in one database, run by "
        f"{res['load_workers']} threads through the production steps (airflow_eos.steps; the Spark job replaced "
        "by its Python stand-in, tests/harness/load.py), windows of every pipeline and neighbouring windows of "
        "one pipeline in flight together, none retried. Every pipeline verified against Kafka by lineage "
        "afterwards, and the ledger read for one committed attempt per window: "
        + (f"{res['load_windows_committed']} windows committed, no deadlock, {res['load_verified_records']:,} "
           "records each once, none missing, nothing extra. " if not res.get("load_problems") else
           f"{res['load_windows_committed']} windows committed, {res['load_failures']} failed: see below. ")
        + f"All {res['load_workers']} threads share one Python process on this 2-core machine: the "
        "times include waiting for the GIL and for the other windows' staging, not only for PostgreSQL's locks."
        "\n\n",
        "".join(f"**VIOLATION: {p}**\n\n" for p in res.get("load_problems") or ()),
        "| | median | p95 | max |\n|---|---:|---:|---:|\n",
        f"| commit step, wall (what a commit task waits, lock waits included) | {res['load_commit_p50_s']:.3f} s "
        f"| {res['load_commit_p95_s']:.3f} s | {res['load_commit_max_s']:.3f} s |\n",
        f"| the target's commit transaction | {res['load_commit_tx_p50_s']:.3f} s "
        f"| {res['load_commit_tx_p95_s']:.3f} s | |\n",
        f"| one window, plan to commit | {res['load_window_p50_s']:.3f} s | {res['load_window_p95_s']:.3f} s | |\n",
        f"\nThe whole load took {res['load_seconds']:.1f} s.\n",
    ])


def main() -> int:
    from airflow_eos.embedded import kafka_service, postgres_service

    with kafka_service() as kafka, postgres_service() as pg:
        figures = measure_load(kafka.address, pg.address)
    print(json.dumps(figures, indent=2))
    print(load_section(figures))
    return 1 if figures["load_problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
