"""Randomized fault schedules, seeded and reproducible.

Each schedule (harness.chaos.Schedule.draw) is drawn from its seed
alone: 2-5 windows, 0-3 random faults per window (any point, raise or crash,
firing 1-3 times), random task retries, runs started in a random order, one at
a time or several at once (a backfill), sometimes a window run twice at once,
sometimes a sweeper with a zero timeout aborting attempts of runs in flight,
zombie attempts that finish at random moments, a sweep, clears of committed
windows (skip or replace), and the failed windows cleared round after round in
random order until all are committed. It ends with verify clean against Kafka
and the totals (see chaos.check).

Every seed runs on every target (harness.chaos.TARGETS): PostgreSQL (its
publishing mode drawn from the seed), the file target and the Kafka target
(faults drawn from the points each one's code reaches; on the Kafka target a
clear of a committed window always skips: ``replace`` does not exist for a
topic, harness.chaos.ON_COMMITTED; on the embedded broker its windows run one
at a time: a broker bug, harness.chaos.EMBEDDED_BROKER). A seed's PostgreSQL
schedule is the one it drew before the other targets existed.

    EOS_CHAOS_N     schedules to run per target (CI: 10; `make chaos N=200` runs more)
    EOS_CHAOS_SEED  the first seed (default: random); schedule k uses seed + k

A failing schedule names its seed and the command that runs it again.
"""

from __future__ import annotations

import os
import random

import pytest
from conftest import PARALLEL, TALLY, Batches, new_pipeline, scratch_database, selected_params

from harness.chaos import TARGETS, Schedule, run_schedule

N = int(os.environ.get("EOS_CHAOS_N") or 10)
BASE = int(os.environ.get("EOS_CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))
SEEDS = [BASE + k for k in range(N)]
# Schedules run together (PARALLEL at a time) before their tests report: a
# batch, not the module, so that any N runs to the end.
BATCH = int(os.environ.get("EOS_CHAOS_BATCH") or 2 * PARALLEL)
TALLY.seeds = (f" (seeds {BASE}..{BASE + N - 1}" if N > 1 else f" (seed {BASE}") + f" on each of {', '.join(TARGETS)})"


@pytest.fixture(scope="module")
def schedules(request, pg_server, chaos_source, tmp_path_factory):
    """The selected schedules, run BATCH at a time (PARALLEL at once) as their tests come."""
    def one(target, seed):
        s = Schedule.draw(seed, target=target)
        with scratch_database(pg_server.address) as url:
            p = new_pipeline(url, chaos_source, f"r{seed}_{target}", on_committed=s.on_committed, mode=s.target_mode,
                             mirror=s.mirror, max_records_per_task=s.max_records_per_task, target=target,
                             root=tmp_path_factory.mktemp(f"lake{seed}"))
            return run_schedule(s, p, tmp_path_factory.mktemp(f"seed{seed}"))

    keys = [(params["target"], params["seed"])
            for params in selected_params(request, "test_randomized_schedule_is_exactly_once")]
    return Batches(keys, one, size=BATCH, parallel=PARALLEL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("target", TARGETS)
def test_randomized_schedule_is_exactly_once(target, seed, schedules, tally):
    result = schedules.result((target, seed))
    if isinstance(result, BaseException):
        raise result
    tally.add(result, schedule=target)
