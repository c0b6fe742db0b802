"""The fault suite's tally: what every scenario and randomized schedule of a
session verified, printed in one block at the session's end.

With pytest-xdist each worker keeps its own tally and hands it to the
controller in ``workeroutput`` (tests/conftest.py merges them), so this module
imports nothing of the chaos driver: the controller, which collects no test,
imports it too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

_COUNTERS = ("faults", "targets", "sources", "pg_restarts")


@dataclass
class Tally:
    scenarios: int = 0
    schedules: int = 0
    violations: int = 0
    records: int = 0
    rows: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    missing: int = 0
    extra: int = 0
    attempts: int = 0
    runs: int = 0
    failed: list[str] = field(default_factory=list)
    seeds: str = ""
    faults: Counter = field(default_factory=Counter)  # fault point -> firings, over every scenario and schedule
    targets: Counter = field(default_factory=Counter)  # target -> randomized schedules run
    sources: Counter = field(default_factory=Counter)  # source topic (ordered, skewed) -> randomized schedules run
    pg_restarts: Counter = field(default_factory=Counter)  # shutdown mode -> randomized schedules restarting PostgreSQL

    def add(self, verdict, *, schedule: str | None = None, source: str = "ordered",
            pg_restart: str | None = None) -> None:
        """Count a scenario's verdict (a harness.chaos.Verdict; ``schedule``: a
        randomized schedule's, on that target, reading ``source``, restarting
        PostgreSQL with ``pg_restart``)."""
        self.faults.update(verdict.faults_fired)
        if schedule:
            self.schedules += 1
            self.targets[schedule] += 1
            self.sources[source] += 1
            if pg_restart:
                self.pg_restarts[pg_restart] += 1
        else:
            self.scenarios += 1
        t = verdict.report.totals
        self.records += t.kafka_records or 0
        self.rows += t.published_rows
        self.dead_letters += t.dead_letters
        self.duplicates += t.duplicates or 0
        self.missing += t.missing or 0
        self.extra += t.extra or 0
        self.attempts += verdict.attempts
        self.runs += verdict.runs

    def to_dict(self) -> dict:
        """Plain values (what xdist can carry from a worker to the controller)."""
        return {f.name: (dict(v) if isinstance(v, Counter) else v)
                for f in fields(self) for v in [getattr(self, f.name)]}

    def merge(self, other: dict) -> None:
        """Add a worker's tally (:meth:`to_dict`) to this one."""
        for f in fields(self):
            value = other.get(f.name)
            if value is None:
                continue
            if f.name in _COUNTERS:
                getattr(self, f.name).update(value)
            elif f.name == "seeds":
                self.seeds = self.seeds or value
            else:
                setattr(self, f.name, getattr(self, f.name) + value)

    def lines(self) -> list[str]:
        """The summary block; [] when the session ran no scenario."""
        t = self
        if not (t.scenarios or t.schedules or t.violations):
            return []
        out = [
            f"chaos: {t.scenarios} scenarios, {t.schedules} randomized schedules{t.seeds}, {t.violations} violations",
            f"chaos: verified {t.records} Kafka records of committed windows = {t.rows} rows published + "
            f"{t.dead_letters} dead letters; {t.duplicates} duplicates, {t.missing} missing, {t.extra} extra; "
            f"{t.attempts} attempts in {t.runs} DAG runs",
        ]
        if t.schedules:
            out.append("chaos: randomized schedules per target: "
                       + ", ".join(f"{k} {v}" for k, v in sorted(t.targets.items()))
                       + "; per source topic: " + ", ".join(f"{k} {v}" for k, v in sorted(t.sources.items()))
                       + "; PostgreSQL restarted: "
                       + (", ".join(f"{k} {v}" for k, v in sorted(t.pg_restarts.items())) or "0"))
        out.append(f"chaos: {sum(t.faults.values())} faults fired: "
                   + (", ".join(f"{k} {v}" for k, v in sorted(t.faults.items())) or "none"))
        out.extend(f"chaos: VIOLATION in {nodeid}" for nodeid in t.failed)
        return out


TALLY = Tally()
