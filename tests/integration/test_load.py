"""Load (issue 22 part 6): 20 pipelines x 24 windows committing concurrently
against one database, its ledger shared, through the production steps (the
Spark job replaced by its Python stand-in): no deadlock, no lost or doubled
window, every pipeline verified against Kafka by lineage. The commit latency
is measured by bench/load.py, not here (tests do not time).

``EOS_LOAD_WINDOWS`` (default 24) sets the windows of each pipeline: ``make
test-fast`` runs 8: the same 20 pipelines committing at once, for a third of
the time (alone on the Xeon, 88 busy CPU-s with 24 windows, 55 with 8)."""

from __future__ import annotations

import os

from harness.load import run_load

PIPELINES = 20
WINDOWS = int(os.environ.get("EOS_LOAD_WINDOWS") or 24)


def test_twenty_pipelines_commit_concurrently_into_one_ledger(ledger, pg_url, kafka, tmp_path):
    result = run_load(pg_url, kafka.address, tmp_path, pipelines=PIPELINES, windows=WINDOWS, per_hour=4,
                      workers=PIPELINES)

    assert result.failures == [], "\n".join(result.failures[:20])
    assert result.ledger_problems == [], "\n".join(result.ledger_problems)
    assert result.committed == PIPELINES * WINDOWS
    assert len(result.verdicts) == PIPELINES
    for name, verdict in result.verdicts.items():
        t = verdict.report.totals
        assert verdict.windows == WINDOWS, name
        assert (t.duplicates, t.missing, t.extra) == (0, 0, 0), (name, t)
        # every record of the pipeline's windows (2 partitions x 4 per hour) is a row or a dead letter
        assert t.kafka_records == WINDOWS * 4 * 2 == t.published_rows + t.dead_letters, (name, t)
