"""`airflow-eos sweep [--dry-run]` says what the sweep did and would do, the
same way: attempts aborted, decided windows finished, attempts left (issue 33:
the dry run said "would abort 1 attempt", the sweep then finished a file
rename and printed "nothing to sweep")."""

from __future__ import annotations

import io

import pytest
import test_sink_kafka as kafka
from test_sink_files import PIPELINE, attempt_state, claim, execute, lineage, publication, seen_lineage, stage
from test_sink_kafka import plans, sink, source, target_topic  # noqa: F401 - the Kafka sink's fixtures

from airflow_eos.cli import main
from airflow_eos.targets.files import FileTarget


def sweep(pg_url, *argv):
    out = io.StringIO()
    assert main(["sweep", "--older-than", "1h", "--postgres-url", pg_url, *argv], out=out) == 0
    return out.getvalue()


def test_dry_run_and_sweep_report_the_aborted_attempt_and_the_finished_decided_window(pg_url, ledger, tmp_path,
                                                                                       freeze_windows):
    root = tmp_path / "lake"
    root.mkdir()
    sink = FileTarget(path=str(root), ledger_url=pg_url).sink()
    w0, w1 = freeze_windows(PIPELINE, [0, 1])
    claim(ledger, PIPELINE, ("orders",), sink.target_id)
    decided = stage(sink, w0)
    sink.decide(decided)  # its commit task died right after the decision
    zombie = stage(sink, w1, prepare=False)  # a stage that died
    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours'")

    listed = sweep(pg_url, "--dry-run")
    lines = listed.splitlines()
    assert lines[0].startswith("would abort 1 attempt(s) opened before "), listed
    [would_abort] = [line for line in lines if zombie.staging in line]
    assert would_abort.split()[-1] == sink.target_id
    [heading] = [line for line in lines if "decided window" in line]
    assert heading.startswith("would finish publishing 1 decided window(s)"), listed
    [would_finish] = [line for line in lines if decided.staging in line]
    assert would_finish.split()[5] == str(decided.epoch)
    assert publication(pg_url, decided)[0] == "decided" and attempt_state(pg_url, zombie)[0] == "checkpointed"
    assert seen_lineage(root) == []  # a dry run changes nothing

    swept = sweep(pg_url)
    assert swept.startswith("aborted 1 attempt(s) opened before "), swept
    said = listed.replace("would finish", "finished").splitlines()[1:]  # the first line has the time of the run
    assert swept.splitlines()[1:] == said, swept  # the dry run said what the sweep did
    assert publication(pg_url, decided)[0] == "published" and attempt_state(pg_url, zombie)[0] == "aborted"
    assert seen_lineage(root) == lineage(w0)
    assert sweep(pg_url).startswith("nothing to sweep: no live attempt opened before ")
    assert sweep(pg_url, "--dry-run").startswith("nothing to sweep: ")


def test_dry_run_and_sweep_report_a_kafka_window_whose_transaction_committed(pg_url, kafka_config, ledger, sink,
                                                                            plans, source, monkeypatch):
    """A commit that died after its Kafka transaction committed, before the ledger
    heard of it: the sweep records the window instead of aborting its attempt; the
    dry run says so beforehand (it said "would abort 1 attempt")."""
    [plan] = plans([0])
    attempt = kafka.stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.after_kafka_commit=raise")
    with pytest.raises(Exception, match="commit.after_kafka_commit"):
        sink.commit(attempt)
    monkeypatch.delenv("EOS_FAULTS")
    claim(ledger, kafka.PIPELINE, (source,), sink.target_id)
    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours'")
    cluster = ["--kafka-bootstrap", kafka_config["bootstrap.servers"]]

    listed = sweep(pg_url, "--dry-run", *cluster)
    assert listed.startswith("would abort 0 attempt(s) opened before "), listed
    assert "would finish publishing 1 decided window(s)" in listed
    [would_finish] = [line for line in listed.splitlines() if attempt.staging in line]
    assert would_finish.split()[-1] == sink.target_id
    assert kafka.attempt_state(pg_url, attempt) == "prepared"  # a dry run changes nothing

    swept = sweep(pg_url, *cluster)
    assert swept.startswith("aborted 0 attempt(s) opened before "), swept
    assert swept.splitlines()[1:] == listed.replace("would finish", "finished").splitlines()[1:]
    assert kafka.attempt_state(pg_url, attempt) == "committed"
    assert kafka.seen_lineage(sink, pg_url) == kafka.lineage(plan)
    assert sweep(pg_url, *cluster).startswith("nothing to sweep: ")
