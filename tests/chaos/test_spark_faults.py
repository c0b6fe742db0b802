"""Faults in the real Spark stage job: a representative subset of the matrix
through run_stage in one shared SparkSession (local[2]: a failed task fails
the job, as in the example DAGs), and the spark-submit job SIGKILLed
mid-stage. Same pipelines, same rows, same check as the rest of the suite.

- a write task's Python worker dying mid-write (an executor lost) while the
  job's own abort fails too (the stage step, steps.stage, aborts the attempt
  after its job failed), then the job commit's worker dying before the
  checkpoint (no checkpoint, the attempt aborted), then the stage task's
  second retry committing;
- spark-submit and everything it started SIGKILLed after the first read task
  reported (chunks staged, others mid-COPY, no checkpoint): nothing aborts the
  attempt; the retry fences it, the teardown aborts it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.submit import stage_job_environment, stage_job_path
from harness.chaos import Harness, SparkStager, check, plan_step
from harness.spark import quiet_session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stager():
    with quiet_session("eos-chaos", master="local[2]") as session:
        yield SparkStager(session)


def attempt_states(p) -> list[tuple[int, str, str | None]]:
    with psycopg.connect(p.url) as conn:
        return conn.execute("SELECT epoch, state, reason FROM eos.attempts WHERE pipeline = %s ORDER BY epoch",
                            (p.name,)).fetchall()


def test_spark_worker_lost_job_abort_failing_then_job_commit_crashing_then_retry(
        stager, make_pipeline, tmp_path, tally):
    """One stage task, three tries, one fault environment (each costs Spark a
    fresh Python worker daemon): (1) a write task's Python worker dies mid-write
    (an executor lost) and the job's own abort fails: the stage step
    (steps.stage, as the operator runs it) aborts the attempt after its job
    failed; (2) the job commit's worker dies before the checkpoint: Spark aborts
    the job and the attempt; (3) the retry stages, and the window commits once.
    (A task raising is tests/e2e and tests/integration/test_spark_stage.py.)"""
    p = make_pipeline("spark_retries", max_records_per_task=6)
    faults = "stage.mid_write=crash*1,abort.inside=raise*1,stage.before_checkpoint=crash*1"
    h = Harness(p, tmp_path, faults={0: faults}, retries=2, stager=stager)
    run = h.run(0)
    assert run.state == "success", h.history()
    # (the first failure's message names FaultInjected: the failed job abort's error)
    stage_tries = [r for s, r in run.tries if s == "stage"]
    assert len(stage_tries) == 3 and stage_tries[2] == "ok" and "ok" not in stage_tries[:2], h.history()
    for point in ("stage.mid_write", "abort.inside", "stage.before_checkpoint"):
        assert (tmp_path / "w0" / f"{point}.0").exists(), point
    states = attempt_states(p)
    assert [(e, st) for e, st, _ in states] == [(1, "aborted"), (2, "aborted"), (3, "committed")], states
    # Its job's own abort failed (FaultInjected); the stage step aborted it after the job's failure, as the
    # operator does (before issue 17 the operator did not, and only the teardown ended it).
    assert states[0][2].startswith("stage job failed: StageFailed: the stage job of"), states
    tally.add(check(h, (0,)))


def test_spark_submit_killed_mid_stage(make_pipeline, tmp_path, tally):
    p = make_pipeline("spark_submit_killed", max_records_per_task=2)  # 12 tasks: the kill lands mid-job
    h = Harness(p, tmp_path)  # the retry runs the stage job without Spark: the same rows, faster
    plan = WindowPlan.from_dict(plan_step(p, p.window(0)))
    attempt = p.target.begin(plan.window)
    bin_dir = Path(sys.executable).parent
    cmd = [str(bin_dir / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           stage_job_path(), "--plan", plan.to_json(), "--attempt", json.dumps(attempt.to_dict()),
           "--transform", "harness.chaos:spark_transform",
           "--max-records-per-task", str(p.max_records_per_task), "--max-bad-records", "1000000",
           # the eos_kafka source: its read tasks report while the job runs, which is when the kill lands
           "--reader", "python"]
    env = {**os.environ, **stage_job_environment(p.target, dict(p.kafka_config), local=True)}
    log = open(tmp_path / "spark-submit.log", "w")
    job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a JVM start on a busy machine
        reported = 0
        while time.monotonic() < deadline and job.poll() is None:
            with psycopg.connect(p.url) as conn:
                reported = conn.execute("SELECT count(*) FROM eos.read_ranges WHERE pipeline = %s",
                                        (p.name,)).fetchone()[0]
            if reported:
                break
            time.sleep(0.05)
        assert reported and job.poll() is None, (tmp_path / "spark-submit.log").read_text()[-3000:]
    finally:
        with_children = job.poll() is None
        os.killpg(job.pid, signal.SIGKILL)  # spark-submit, its JVM and its Python workers: a lost worker node
        job.wait(30)
        log.close()
    assert with_children
    h.note(f"spark-submit SIGKILLed after {reported} read task(s) reported")
    with psycopg.connect(p.url) as conn:
        state = conn.execute("SELECT state FROM eos.attempts WHERE pipeline = %s", (p.name,)).fetchone()[0]
    assert state == "open"  # killed before its checkpoint; nothing aborted it
    # The stage task's retry (a new attempt fences the killed one), then the teardown aborts it.
    h.run_until_committed([0])
    tally.add(check(h, (0,)))
