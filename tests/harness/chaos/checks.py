"""The verdict of a scenario: everything exactly-once promises, checked by lineage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from airflow_eos.core import attempt as attempts
from airflow_eos.verify import VerifyReport, verify
from harness.chaos.driver import Harness
from harness.chaos.pipeline import Pipeline, mirrored_offsets
from harness.chaos.targets import LEFTOVERS, READERS

# --------------------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    report: VerifyReport
    windows: int
    attempts: int
    runs: int
    faults_fired: Counter = field(default_factory=Counter)  # fault point -> times it fired

    def line(self) -> str:
        t = self.report.totals
        return (f"{self.windows} windows committed, {t.kafka_records} records = {t.published_rows} rows + "
                f"{t.dead_letters} dead letters, {self.attempts} attempts in {self.runs} runs")


def check(h: Harness, windows: Sequence[int], *, sweep_first: bool = False) -> Verdict:
    """Everything exactly-once promises, for the pipeline's windows:

    - every window committed; verify (against Kafka) clean: each record of each
      committed window published once or a dead letter, nothing else; row
      counts, checkpoints and eos.partition_offsets as the ledger says;
    - published rows + dead letters == the records Kafka holds in the windows;
    - no attempt left live and no staging left behind (after the sweep, if
      ``sweep_first``: zombies are the sweeper's job), as the target keeps it
      (:data:`LEFTOVERS`);
    - what a reader of the target sees, read directly where the target is not
      a table of the ledger's database (:data:`READERS`: the file target's
      Parquet, read with PyArrow), is the Kafka records of the committed
      windows by lineage, once each, and nothing else;
    - an Avro source's poisoned records (``p.avro``) of the committed windows are
      its dead letters, by lineage, each with its reason, and nothing else is;
    - every window emitted its Asset event; the mirrored consumer group (if
      any) holds the ledger's offsets.
    """
    p = h.pipeline
    if sweep_first:
        h.sweep()
    problems = []
    with psycopg.connect(p.url) as conn:
        states = dict(conn.execute("SELECT window_start, state FROM eos.windows WHERE pipeline = %s",
                                   (p.name,)).fetchall())
        live = conn.execute("SELECT window_start, epoch, state FROM eos.attempts WHERE pipeline = %s"
                            " AND state IN ('open', 'checkpointed', 'prepared')", (p.name,)).fetchall()
        left = LEFTOVERS[p.spec.kind](p, conn)
        read_problems = READERS[p.spec.kind](p, conn, windows) if p.spec.kind in READERS else []
        if p.avro is not None:
            read_problems += poisoned_record_problems(p, conn)
        n_attempts = conn.execute("SELECT count(*) FROM eos.attempts WHERE pipeline = %s", (p.name,)).fetchone()[0]
        ledger_offsets = attempts.load_offsets(conn, p.name)
    for i in windows:
        state = states.get(p.window(i).start)
        if state != "committed":
            problems.append(f"window {i} is {state or 'not planned'}, not committed")
        if not h.asset_events.get(i):
            problems.append(f"window {i} emitted no Asset event")
    if live:
        problems.append(f"live attempts left: {live}")
    if left:
        problems.append(f"staging left behind: {left}")
    problems += read_problems
    report = verify(p.ledger, dict(p.kafka_config), p.target, p.name)
    if not report.clean:
        problems.append(str(report))
    t = report.totals
    if report.committed_windows != len(windows):
        problems.append(f"verify saw {report.committed_windows} committed windows, expected {len(windows)}")
    if (t.duplicates, t.missing, t.extra) != (0, 0, 0):
        problems.append(f"duplicates {t.duplicates}, missing {t.missing}, extra {t.extra}")
    if t.kafka_records is None or t.kafka_records != t.published_rows + t.dead_letters:
        problems.append(f"{t.kafka_records} records in Kafka != {t.published_rows} rows + "
                        f"{t.dead_letters} dead letters")
    if p.mirror_group:
        mirrored = mirrored_offsets(p.kafka_config, p.mirror_group, sorted(ledger_offsets))
        if mirrored != ledger_offsets:
            problems.append(f"consumer group {p.mirror_group} holds {mirrored}, the ledger {ledger_offsets}")
    if problems:
        raise AssertionError("exactly-once violated:\n  " + "\n  ".join(problems)
                             + "\nwhat happened:\n" + h.history())
    return Verdict(report, len(windows), n_attempts, h.runs, h.faults_fired())


def poisoned_record_problems(p: Pipeline, conn) -> list[str]:
    """The committed windows' dead letters against the Avro source's poisoned
    records in the windows' frozen ranges: the same (partition, offset)s, each
    dead letter with its record's reason."""
    assert p.avro is not None
    ranges = conn.execute(
        "SELECT r.partition, r.start_offset, r.end_offset FROM eos.window_ranges r"
        " JOIN eos.windows w USING (pipeline, window_start) WHERE r.pipeline = %s AND w.state = 'committed'",
        (p.name,)).fetchall()
    expected = {(partition, offset): reason for partition, offset, reason in p.avro.poisoned
                if any(partition == q and start <= offset < end for q, start, end in ranges)}
    dead = {(partition, offset): error for partition, offset, error in conn.execute(
        'SELECT partition, "offset", error FROM eos.dead_letters WHERE pipeline = %s', (p.name,)).fetchall()}
    problems = []
    if dead.keys() != expected.keys():
        problems.append(f"dead letters {sorted(dead.keys() - expected.keys())} are not poisoned records; poisoned "
                        f"records {sorted(expected.keys() - dead.keys())} are not dead letters")
    wrong = {k: dead[k] for k in dead.keys() & expected.keys() if expected[k] not in dead[k]}
    if wrong:
        problems.append(f"dead letters without their record's reason: {wrong}")
    if not expected:
        problems.append("the committed windows hold no poisoned record: nothing of the Avro source was checked")
    return problems


def attempt_states(p: Pipeline, i: int) -> list[tuple[int, str]]:
    """(epoch, state) of window ``i``'s attempts, oldest first."""
    with psycopg.connect(p.url) as conn:
        return conn.execute("SELECT epoch, state FROM eos.attempts WHERE pipeline = %s AND window_start = %s"
                            " ORDER BY epoch", (p.name, p.window(i).start)).fetchall()




def published_lineage(p: Pipeline) -> Counter:
    """(window start, topic, partition, offset) -> copies of the pipeline's
    published rows, read through the target's published relation (what
    verify audits), in one snapshot."""
    with psycopg.connect(p.url) as conn, conn.transaction():
        relation = p.target.published_relation(conn, p.name)
        return Counter(conn.execute(sql.SQL(
            "SELECT eos_window_start, eos_topic, eos_partition, eos_offset FROM {} AS published"
            " WHERE eos_pipeline = %s").format(relation), (p.name,)).fetchall())
