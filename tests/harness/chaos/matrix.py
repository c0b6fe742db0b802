"""Every fault point x {raise, crash} x every recovery action, for every target
(the points its code reaches: harness.chaos.TARGET_POINTS), each ending with
verify clean against Kafka: PostgreSQL 8 x 2 x 4 = 64 cells, the file target
9 x 2 x 4 = 72 (its commit is a two-phase commit: ``commit.after_decision``
and ``commit.after_rename`` instead of ``commit.after_publish``), the Kafka
target 7 x 2 x 4 = 56: the points of its own code (the stage's write into its
staging, its commit with ``commit.mid_produce`` and
``commit.after_kafka_commit``, its abort). Its plan, checkpoint and prepare
are the core's over the PostgreSQL target's staging tables, tested there
(:data:`CORE_POINTS`; the randomized schedules still draw them for it).

Each cell runs two neighbouring windows of a fresh pipeline; the first carries
the fault, firing once (``point=action*1``), so that the recovery meets exactly
the state the fault left behind:

- retry:       tasks have one retry; the failed task runs again (a stage retry
               opens a new attempt, fencing the crashed one);
- clear:       no retries; the failed run is cleared at once: the whole task
               group runs again from plan;
- rerun_later: no retries; the later window commits first, then the failed one
               is cleared (commits out of order; offsets wait for the gap);
- backfill:    no retries; both windows run at once, started in a random
               order, then the failed one is cleared.

``abort.inside`` only fires when the teardown has a live attempt to abort, so
its cells also make the window's commit fail (``commit.before_publish``);
under ``retry`` the commit fails for good (twice), the teardown's retry
finishes the abort, and a clear commits the window.

Cells are independent pipelines and mostly wait on the broker and the
database, so a target's module runs its selected cells PARALLEL at a time up
front; each cell's test item then reports its own outcome. Each target has a
module of its own (tests/chaos/test_matrix_<target>.py, built by
:func:`matrix_module`), so that pytest-xdist runs them side by side.

The file target runs on each of its stores (:data:`~harness.chaos.STORES`):
every cell on a local root, and on HDFS (test_matrix_files_hdfs.py) the cells
of :func:`store_cells`: every fault point with both actions, the recoveries
rotated. The store changes only what lies under the file system's operations
(rename, replace, atomic files, listing, deleting a tree) and so the state a
fault leaves behind at each point; the recoveries are the core's, whatever the
store, and the local cells run each of them at every point. (Measured: a cell
costs ~0.6 CPU-s on HDFS, ~0.2 on a local root; all 72 on HDFS would add ~35
CPU-s to a run beside these 18.)
"""

from __future__ import annotations

import os
import random
import uuid

import pytest

from harness.chaos import (ACTIONS, POINT_STEPS, PUBLICATION_POINTS, RECOVERIES, TARGET_POINTS, TARGETS, Harness,
                           check)
from harness.chaos.cases import PARALLEL, new_pipeline, run_concurrently, selected_params

WINDOWS = (0, 1)
FAULTY = 0
# Points in code that no target of its own runs: the plan, and the checkpoint
# and prepare over a staging the target shares with PostgreSQL (the Kafka
# target's). Matrix cells of a target that shares them would test PostgreSQL's
# code again; the matrix keeps them for the targets whose code they are in.
CORE_POINTS = frozenset({"plan.after_freeze", "stage.before_checkpoint", "checkpoint.before_prepare"})
MATRIX_POINTS = {t: TARGET_POINTS[t] - (CORE_POINTS if t == "kafka" else frozenset()) for t in TARGETS}
# EOS_MATRIX=rotated (``make test-fast``): every store runs the rotated cells
# of store_cells, a quarter of the matrix that still reaches every fault
# point with both actions and every recovery; ``make test`` runs them all.
ROTATED_ONLY = os.environ.get("EOS_MATRIX", "all") == "rotated"


def store_cells(target: str, store: str) -> list[tuple[str, str, str]]:
    """The (point, action, recovery) cells of ``target`` on ``store``: on a
    local root every one; on another store each point with both actions,
    recovery number (point number + action number) mod 4, so that each point
    meets two recoveries and each action every recovery (18 of the file
    target's 72 cells). With EOS_MATRIX=rotated, a local root too runs only
    those."""
    points = sorted(MATRIX_POINTS[target])
    if store == "local" and not ROTATED_ONLY:
        return [(p, a, r) for p in points for a in ACTIONS for r in RECOVERIES]
    return [(p, a, RECOVERIES[(i + j) % len(RECOVERIES)])
            for i, p in enumerate(points) for j, a in enumerate(ACTIONS)]


def cell_root(store: str, state_dir, request):
    """Where a cell's roots go: under its state dir, or a directory of its own
    on the session's HDFS (its fixture started by the first cell that needs it)."""
    if store == "hdfs":
        return f"{request.getfixturevalue('hdfs').address}/chaos/{uuid.uuid4().hex}"
    return state_dir / "lake"


def first_failure(outcome, step):
    return next((r for s, r in outcome.tries if s == step and r != "ok"), None)


def run_cell(target: str, point: str, action: str, recovery: str, url: str, source: dict, state_dir, root):
    p = new_pipeline(url, source, f"m_{target}_{point}_{action}_{recovery}", mirror=point.startswith("commit."),
                     target=target, root=root)
    retries = 1 if recovery == "retry" else 0
    spec = f"{point}={action}*1"
    teardown_fault = point == "abort.inside"
    if teardown_fault:
        spec += f",commit.before_publish=raise*{retries + 1}"
    # In a backfill, a later window's commit can finish the faulty window's decided publication
    # before its own commit does (core/publication.py), and a fault inside it would then never fire:
    # there the faulty window's commit goes first (the others still run beside it up to their commit).
    in_publication = recovery == "backfill" and point in PUBLICATION_POINTS.get(target, ())
    h = Harness(p, state_dir, faults={FAULTY: spec}, retries=retries, commits_after=FAULTY if in_publication else None)
    step = "abort" if teardown_fault else POINT_STEPS[point][0]

    if recovery == "backfill":
        order = list(WINDOWS)
        random.Random(f"{point}/{action}").shuffle(order)
        outcomes = {o.window: o for o in h.run_many(order, parallel=len(order))}
    else:
        first = [FAULTY] if recovery == "clear" else list(WINDOWS)
        outcomes = {o.window: o for o in h.run_many(first)}
    faulty = outcomes[FAULTY]

    # The fault fired where it should, and did what it says.
    assert (state_dir / f"w{FAULTY}" / f"{point}.0").exists(), h.history()
    expected = "crashed" if action == "crash" else "raised FaultInjected"
    assert first_failure(faulty, step) == expected, h.history()
    if recovery == "retry" and not teardown_fault:
        assert faulty.state == "success", h.history()
        assert [r for s, r in faulty.tries if s == step] == [expected, "ok"], h.history()
    elif teardown_fault:
        assert faulty.state == "failed" and faulty.failed_step == "commit", h.history()
        assert [r for s, r in faulty.tries if s == "abort"] == [expected] + ["ok"] * retries, h.history()
    else:
        assert faulty.state == "failed" and faulty.failed_step == step, h.history()

    # Recover: clear what failed (for rerun_later, after the later window committed).
    if recovery == "clear":
        h.run_until_committed([FAULTY])
        h.run_many([i for i in WINDOWS if i != FAULTY])
    else:
        h.run_until_committed([i for i, o in outcomes.items() if o.state != "success"])
    return check(h, WINDOWS)


def matrix_module(target: str, store: str = "local"):
    """The module fixture and the test of ``target``'s cells on ``store``
    (:func:`store_cells`), for its test module to bind: ``matrix,
    test_fault_then_recovery_is_exactly_once = matrix_module("postgres")``.
    The fixture runs the module's selected cells at once; each test item
    reports its own."""

    @pytest.fixture(scope="module")
    def matrix(request, chaos_db, chaos_source, tmp_path_factory):
        cells = {}
        for params in selected_params(request, "test_fault_then_recovery_is_exactly_once"):
            key = (params["point"], params["action"], params["recovery"])
            state_dir = tmp_path_factory.mktemp("cell")
            cells[key] = (target, *key, chaos_db, chaos_source, state_dir, cell_root(store, state_dir, request))
        return run_concurrently(cells, run_cell, PARALLEL)

    @pytest.mark.parametrize("point,action,recovery", store_cells(target, store))
    def test_fault_then_recovery_is_exactly_once(point, action, recovery, matrix, tally):
        result = matrix[point, action, recovery]
        if isinstance(result, BaseException):
            raise result
        tally.add(result)

    return matrix, test_fault_then_recovery_is_exactly_once
