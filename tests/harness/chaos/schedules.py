"""Randomized fault schedules: drawn from a seed alone, played by the driver, checked.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg

from airflow_eos.core.errors import LedgerUnavailable
from airflow_eos.targets.postgres.target import PARTITION_PER_WINDOW
from harness.chaos.checks import Verdict, check
from harness.chaos.driver import Harness, Zombie
from harness.chaos.pipeline import ACTIONS, ON_COMMITTED, STORES, TARGET_POINTS, Pipeline

# --------------------------------------------------------------------------- randomized schedules

SKEWED = 0.2  # the share of schedules that read the topic of skewed timestamps (it costs nothing more)
# The share of schedules that restart PostgreSQL: each needs a server of its own (~2 s to start).
PG_RESTART = 0.05
# The targets whose schedules read the Avro topic (harness.chaos.avro_source_records: two writer
# schemas, poisoned records) in place of the ordered one, seed after seed in turn: one in AVRO_EVERY.
AVRO_TARGETS = ("postgres",)
AVRO_EVERY = 3


@dataclass(frozen=True)
class Schedule:
    """A random fault schedule, drawn from a seed alone: the same seed gives the
    same windows, faults, orders and events (thread interleavings of parallel
    runs aside)."""

    seed: int
    windows: int
    on_committed: str  # skip | replace: what clearing a committed window does
    retries: int  # of every task
    parallel: int  # DAG runs at once (max_active_runs)
    mirror: bool
    max_records_per_task: int
    faults: dict[int, str]  # window -> EOS_FAULTS
    order: tuple[int, ...]  # first runs, in this order; a window twice is two runs at once
    zombies: tuple[int, ...]  # windows that get a zombie attempt after the first runs
    reruns: tuple[int, ...]  # committed windows cleared again (skip or replace)
    sweep_between: bool  # sweep (older_than=0) between the recovery rounds and the reruns
    # A sweeper with a timeout of 0 running during the first runs: far too short
    # (it aborts live runs' attempts), so runs fail, but nothing may publish twice.
    sweep_during: bool = False
    target_mode: str = "replace_window"  # how the PostgreSQL target publishes (replace_window or partition_per_window)
    target: str = "postgres"  # one of TARGETS: chosen by the caller, not drawn (a seed replays on its target)
    # The source topic: "ordered" (source_records) or "skewed" (skewed_source_records: timestamps
    # out of order, decreasing across window boundaries, some hours late) or "avro" (the ordered
    # topic's places in Avro: avro_source_records; on AVRO_TARGETS, a turn of the seed, not a draw).
    source: str = "ordered"
    # PostgreSQL restarted during the first runs (pg_ctl's shutdown mode: fast, or
    # immediate = a crash), at pg_restart_after seconds; None: not restarted. Such a
    # schedule runs on a server of its own (the caller's), its database durable.
    pg_restart: str | None = None
    pg_restart_after: float = 0.0
    # Where the target's data lives, for a target with several stores (STORES): the
    # seed's turn, not a draw (a seed keeps every draw it had before stores existed).
    store: str = "local"

    @classmethod
    def draw(cls, seed: int, *, max_windows: int = 5, target: str = "postgres") -> "Schedule":
        """The schedule of ``seed`` on ``target``: faults at the points the
        target's code reaches (for PostgreSQL the same draws as before the file
        target's points existed); on a target with several stores, seed after
        seed takes them in turn (the file target: even seeds local, odd HDFS);
        on AVRO_TARGETS, every AVRO_EVERY-th seed that drew the ordered topic
        reads the Avro one instead (its other draws unchanged)."""
        rng = random.Random(seed)
        points = sorted(TARGET_POINTS[target])
        n = rng.randint(2, max_windows)
        faults = {}
        for i in range(n):
            items = {}
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                point = rng.choice(points)
                items[point] = f"{point}={rng.choice(ACTIONS)}*{rng.choice((1, 1, 2, 3))}"
            if items:
                faults[i] = ",".join(items.values())
        order = list(range(n))
        rng.shuffle(order)
        for i in rng.sample(range(n), k=rng.choice((0, 0, 1))):  # a duplicate run: a clear while running
            order.insert(rng.randrange(len(order) + 1), i)
        on_committed = rng.choice(("skip", "replace"))
        schedule = cls(
            seed=seed, windows=n, on_committed=on_committed if on_committed in ON_COMMITTED[target] else "skip",
            retries=rng.choice((0, 0, 1, 2)),
            parallel=rng.choice((1, 2, 4)), mirror=rng.random() < 0.3,
            max_records_per_task=rng.choice((5, 40)),
            faults=faults, order=tuple(order),
            zombies=tuple(rng.sample(range(n), k=rng.choice((0, 0, 1, 2)))),
            reruns=tuple(rng.choices(range(n), k=rng.choice((0, 1, 2)))),
            sweep_between=rng.random() < 0.5,
            sweep_during=rng.random() < 0.25,
            target_mode=rng.choice(("replace_window", PARTITION_PER_WINDOW)),  # drawn after the above: older
            source="skewed" if rng.random() < SKEWED else "ordered",  # seeds replay (new draws go last)
            pg_restart=(rng.random() < PG_RESTART) and rng.choice(("fast", "immediate")) or None,
            pg_restart_after=round(rng.uniform(0.05, 1.5), 3),
            target=target,
            store=stores[seed % len(stores)] if (stores := STORES.get(target)) else "local",
        )
        if schedule.source == "ordered" and target in AVRO_TARGETS and seed % AVRO_EVERY == 0:
            return replace(schedule, source="avro")
        return schedule

    def __str__(self) -> str:
        faults = "; ".join(f"w{i}: {spec}" for i, spec in sorted(self.faults.items())) or "none"
        target = f"target mode={self.target_mode}" if self.target == "postgres" else f"target={self.target}"
        if self.target in STORES:
            target += f" on {self.store}"
        return (f"schedule seed={self.seed}: {self.windows} windows, {target}, source={self.source}, "
                f"on_committed={self.on_committed}, "
                f"retries={self.retries}, parallel={self.parallel}, mirror={self.mirror}, "
                f"max_records_per_task={self.max_records_per_task}, first runs {list(self.order)}, "
                f"zombies {list(self.zombies)}, reruns {list(self.reruns)}, sweep={self.sweep_between}, "
                f"sweep_during={self.sweep_during}; "
                + (f"PostgreSQL restarted ({self.pg_restart}) at {self.pg_restart_after}s; " if self.pg_restart else "")
                + f"faults: {faults}")


class _Background(threading.Thread):
    """A thread of a schedule (the sweeper, the restarter) whose failure fails
    the schedule: pytest would only warn of an exception in a thread."""

    def __init__(self, name: str, work: Callable[..., None], *args: object) -> None:
        super().__init__(name=name, daemon=True)
        self._work, self._args = work, args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._work(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to the schedule by finish()
            self.error = exc

    def join_within(self, seconds: float) -> None:
        if self.is_alive():
            self.join(seconds)

    def finish(self) -> None:
        """Raise what the thread died of, if it did, or if it never ended."""
        if self.is_alive():
            raise AssertionError(f"the {self.name} did not end within a minute of the first runs")
        if self.error is not None:
            raise AssertionError(f"the {self.name} died: {type(self.error).__name__}: {self.error}") from self.error


def _sweep_until(h: Harness, stop: threading.Event, rng: random.Random) -> None:
    while not stop.wait(rng.uniform(0.02, 0.4)):
        try:
            h.sweep()
        except Exception as exc:  # noqa: BLE001 - the database restarting: sweep again later; else the sweeper dies
            if not _database_down(exc):
                raise
            h.note(f"sweep failed: {type(exc).__name__}: {exc}")


def _database_down(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was caused by, the server refusing or dropping a
    connection: the ledger's, or the Iceberg SQL catalog's on the same server
    (the target reports that as a TargetError, caused by SQLAlchemy's error,
    caused by psycopg's)."""
    while exc is not None:
        if isinstance(exc, (LedgerUnavailable, psycopg.OperationalError)):
            return True
        exc = exc.__cause__
    return False


def _restart_at(h: Harness, s: Schedule, restart: Callable[[str], None], over: threading.Event) -> None:
    if over.wait(s.pg_restart_after):
        h.note("the first runs ended before the restart: PostgreSQL restarted after them")
    h.note(f"PostgreSQL restarting ({s.pg_restart})")
    restart(s.pg_restart or "fast")
    h.note("PostgreSQL back")


def run_schedule(s: Schedule, p: Pipeline, state_root: Path, *,
                 restart_postgres: Callable[[str], None] | None = None) -> "Verdict":
    """Play a schedule on a fresh pipeline (in a database of its own: the sweep
    is database-wide) and check the result. Raises AssertionError naming the seed.
    ``restart_postgres(mode)`` restarts the pipeline's server (``s.pg_restart``)."""
    if s.pg_restart and restart_postgres is None:
        raise ValueError(f"schedule seed={s.seed} restarts PostgreSQL: give it a server of its own to restart")
    rng = random.Random(s.seed * 7919 + 1)
    h = Harness(p, state_root, faults=dict(s.faults), retries=s.retries)
    h.note(str(s))
    stop = threading.Event()
    sweeper = _Background("sweeper", _sweep_until, h, stop, random.Random(s.seed * 31 + 7))
    restarter = _Background("PostgreSQL restarter", _restart_at, h, s, restart_postgres, stop)
    try:
        if s.sweep_during:
            sweeper.start()
        if s.pg_restart:
            restarter.start()
        try:
            first = h.run_many(s.order, parallel=s.parallel)
        finally:
            stop.set()
            sweeper.join_within(60)
            restarter.join_within(60)  # the server is back before the recoveries start
        for thread in (sweeper, restarter):
            if thread.ident is not None:
                thread.finish()
        committed = {o.window for o in first if o.state == "success"}
        zombies = []
        for i in s.zombies:
            zombies.append(Zombie(p, i))
            h.note(f"w{i} zombie attempt {zombies[-1].attempt.epoch} opened, half staged")
        pending = sorted(set(range(s.windows)) - committed)
        rng.shuffle(pending)
        if pending:
            h.run_until_committed(pending, parallel=s.parallel, rng=rng)
        finish_now = rng.sample(zombies, k=len(zombies) // 2 + rng.randint(0, len(zombies) % 2))
        for z in finish_now:
            h.note(f"w{z.i} zombie attempt {z.attempt.epoch} finished: {z.finish()}")
        if s.sweep_between:
            h.sweep()
        for i in s.reruns:  # a clear of a committed window; it may meet faults left over
            for _ in range(20):
                if h.run(i).state == "success":
                    break
            else:
                raise AssertionError(f"rerun of committed window {i} never succeeded")
        for z in zombies:
            if z not in finish_now:
                h.note(f"w{z.i} zombie attempt {z.attempt.epoch} finished: {z.finish()}")
        # Zombies nobody aborted are the sweeper's job.
        return check(h, range(s.windows), sweep_first=True)
    except (KeyboardInterrupt, SystemExit):
        raise  # a stopped run, not a failed schedule
    except BaseException as exc:
        reproduce = (f"reproduce: EOS_CHAOS_SEED={s.seed} EOS_CHAOS_N=1 pytest tests/chaos/test_randomized.py "
                     f"-k '{s.target}-'")
        if isinstance(exc, AssertionError) and "what happened" in str(exc):
            raise AssertionError(f"{s}\n{reproduce}\n{exc}") from None
        raise AssertionError(f"{s}\n{reproduce}\n{type(exc).__name__}: {exc}\n"
                             f"what happened:\n{h.history()}") from exc


