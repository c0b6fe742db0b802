"""Randomized fault schedules, seeded and reproducible.

Each schedule (harness.chaos.Schedule.draw) is drawn from its seed
alone: 2-5 windows, 0-3 random faults per window (any point, raise or crash,
firing 1-3 times), random task retries, runs started in a random order, one at
a time or several at once (a backfill), sometimes a window run twice at once,
sometimes a sweeper with a zero timeout aborting attempts of runs in flight,
zombie attempts that finish at random moments, a sweep, clears of committed
windows (skip or replace), and the failed windows cleared round after round in
random order until all are committed; one schedule in five reads a topic whose
timestamps are out of order (harness.chaos.skewed_source_records: decreasing
across window boundaries, some records hours late); on PostgreSQL, every third
seed that would read the ordered topic reads it in Avro instead (two writer
schemas and poisoned records, decoded against the session's schema registry;
the check accounts for each poisoned record as a dead letter with its reason,
by lineage); one in twenty restarts
PostgreSQL during its first runs (fast or immediate shutdown, at a moment drawn
from the seed), on a server of its own. It ends with verify clean against Kafka
and the totals (see chaos.check).

Every seed runs on every target (harness.chaos.TARGETS): PostgreSQL (its
publishing mode drawn from the seed), the file target (its root a local
directory for an even seed, a directory on HDFS for an odd one:
harness.chaos.STORES) and the Kafka target (faults drawn from the points
each one's code reaches; on the Kafka target a clear of a committed window
always skips: ``replace`` does not exist for a topic, harness.chaos.ON_COMMITTED). A seed's PostgreSQL
schedule is the one it drew before the other targets existed. They run seed
by seed, each seed on every target in turn (conftest.pytest_collection_modifyitems).

    EOS_CHAOS_N     randomized schedules to run in all, spread over the targets: that
                    many seeds divided by the number of targets, rounded up, each on
                    every target (default 201: 67 seeds, in every `make test`;
                    `make chaos N=2000`: 667 seeds, 2,001 schedules)
    EOS_CHAOS_SEED  the first seed (default: random, drawn by tests/conftest.py); seed k is seed + k
    EOS_CHAOS_PARALLEL  schedules at once (default 4); EOS_CHAOS_AHEAD how many
                    may run ahead of the test that reports them (default 2 x PARALLEL)

A failing schedule names its seed and the command that runs it again.
"""

from __future__ import annotations

import math
import os

import psycopg
import pytest

from airflow_eos.embedded import PostgresServer
from harness.chaos import TARGETS, Schedule, delete_topic, run_schedule
from harness.chaos.cases import PARALLEL, Rolling, new_pipeline, scratch_database, selected_params
from harness.tally import TALLY

# A number of schedules in all, as the issue that asked for them counts them
# ("200 randomized schedules ... spread over the targets"): a target added to
# TARGETS takes its share instead of making every run longer by a third.
SCHEDULES = int(os.environ.get("EOS_CHAOS_N") or 201)
N = max(1, math.ceil(SCHEDULES / len(TARGETS)))  # seeds, each run on every target
BASE = int(os.environ["EOS_CHAOS_SEED"])  # drawn once per pytest command by tests/conftest.py
SEEDS = [BASE + k for k in range(N)]
# Schedules run in the background, PARALLEL at once, at most AHEAD ahead of
# the test that reports them (conftest.Rolling): any N runs to the end.
AHEAD = int(os.environ.get("EOS_CHAOS_AHEAD") or 2 * PARALLEL)
TALLY.seeds = (f" (seeds {BASE}..{BASE + N - 1}" if N > 1 else f" (seed {BASE}") + f" on each of {', '.join(TARGETS)})"


@pytest.fixture(scope="module")
def schedules(request, pg_server, ledger_template, chaos_source, chaos_skewed_source, tmp_path_factory):
    """The selected schedules, PARALLEL at once, in the order their tests come."""
    sources = {"ordered": chaos_source, "skewed": chaos_skewed_source}
    keys = [(params["target"], params["seed"])
            for params in selected_params(request, "test_randomized_schedule_is_exactly_once")]
    # Started here, in the fixture's thread, if a selected schedule needs it.
    drawn = [Schedule.draw(seed, target=target) for target, seed in keys]
    hdfs = request.getfixturevalue("hdfs").address if any(s.store == "hdfs" for s in drawn) else None
    if any(s.source == "avro" for s in drawn):  # the schema registry too
        sources["avro"] = request.getfixturevalue("chaos_avro_source")

    def one(target, seed):
        s = Schedule.draw(seed, target=target)
        if s.pg_restart:  # a server of its own to restart, a durable database on it
            with PostgresServer() as server, scratch_database(server.url, durable=True) as url:
                with psycopg.connect(server.url, autocommit=True) as admin:
                    admin.execute("CHECKPOINT")  # the ledger's migrations on disk too
                return play(s, url, restart_postgres=server.restart)
        with scratch_database(pg_server.address, template=ledger_template) as url:
            return play(s, url)

    def play(s, url, **kwargs):
        root = f"{hdfs}/chaos/lake{s.seed}" if s.store == "hdfs" else tmp_path_factory.mktemp(f"lake{s.seed}")
        p = new_pipeline(url, sources[s.source], f"r{s.seed}_{s.target}", on_committed=s.on_committed,
                         mode=s.target_mode, mirror=s.mirror, max_records_per_task=s.max_records_per_task,
                         target=s.target, root=root)
        verdict = run_schedule(s, p, tmp_path_factory.mktemp(f"seed{s.seed}"), **kwargs)
        if p.target_topic:  # checked; a failed schedule keeps its topic for whoever reads the report
            delete_topic(p.kafka_config["bootstrap.servers"], p.target_topic)
        return s, verdict

    # Made once, here: the first call clears a --basetemp, and two schedule threads
    # making it at once collided (FileExistsError in the first two schedules).
    tmp_path_factory.getbasetemp()
    rolling = Rolling(keys, one, parallel=PARALLEL, ahead=AHEAD)
    yield rolling
    rolling.close()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("target", TARGETS)
def test_randomized_schedule_is_exactly_once(target, seed, schedules, tally):
    result = schedules.result((target, seed))
    if isinstance(result, BaseException):
        raise result
    schedule, verdict = result
    tally.add(verdict, schedule=target if schedule.store == "local" else f"{target} on {schedule.store}",
              source=schedule.source, pg_restart=schedule.pg_restart)
