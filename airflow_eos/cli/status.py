"""``airflow-eos status`` (a pipeline's windows, attempts, offsets and lag) and
``airflow-eos release`` (forget a pipeline's claim)."""

from __future__ import annotations

from typing import Any, TextIO

import psycopg

from airflow_eos.cli.connections import OK, UsageError, postgres_url, resolve
from airflow_eos.cli.output import JSON, iso, print_json, table
from airflow_eos.core import attempt as attempts
from airflow_eos.core.database import redact
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.ownership import Claim
from airflow_eos.core.source import KafkaLog, per_partition
from airflow_eos.core.windows import TopicPartition

ATTEMPT_STATES = tuple(attempts.AttemptState)  # in the order of an attempt's life
# A window committed in the ledger whose publication has not reached the target (Ledger.unpublished_windows).
UNPUBLISHED = "decided, not published"
UNPUBLISHED_ADVICE = ("{n} window(s) decided, not published: committed in the ledger (offsets advanced) but not in "
                      "the target, so readers do not see them. The commit task's log says why (e.g. a directory "
                      "in the way); fix that, then retry the commit task or clear the run: it publishes them. "
                      "Their commits and reruns fail until then.")


def cmd_status(args, out: TextIO) -> int:
    conns = resolve(args)
    status = read_status(Ledger(conns.postgres_url), args.pipeline, kafka_config=conns.kafka_config,
                         kafka_timeout=args.kafka_timeout)
    if args.output == JSON:
        print_json(status, out)
    else:
        print_status(status, out, limit=args.limit)
    return OK


def read_status(ledger: Ledger, pipeline: str, *, kafka_config: dict[str, Any] | None = None,
                kafka_timeout: float = 10.0) -> dict[str, Any]:
    """A pipeline's windows, attempts and offsets (and, with Kafka, the end of
    each log and the lag), as the JSON document ``status -o json`` prints."""
    with ledger.connect() as conn, conn.transaction():
        require_ledger(conn, ledger)
        windows = ledger.windows(conn, pipeline)
        if not windows:
            known = ledger.pipelines_with_windows(conn, limit=20)
            raise UsageError(f"pipeline {pipeline!r} has no windows in {redact(ledger.url)}"
                             + (f"; it knows: {', '.join(known)}" if known else ""))
        counts = attempts.attempt_counts(conn, pipeline)
        offsets = attempts.load_offsets(conn, pipeline)
        claim = ledger.load_claim(conn, pipeline) if ledger.records_claims(conn) else None
        planned = ledger.planned_partitions(conn, pipeline)
        unpublished = ledger.unpublished_windows(conn, pipeline)

    def state(w) -> str:
        return UNPUBLISHED if w.start in unpublished else str(w.state)

    by_state: dict[str, int] = {}
    for w in windows:
        by_state[state(w)] = by_state.get(state(w), 0) + 1
    tps = sorted(planned | set(offsets))
    ends: dict[TopicPartition, int] = {}
    if kafka_config is not None:
        with KafkaLog(kafka_config, timeout=kafka_timeout) as log_:
            tps = sorted(set(tps) | set(log_.partitions(sorted({tp.topic for tp in tps}))))
            ends = {tp: b.end for tp, b in per_partition(log_, log_.bounds, tps).items()}
    return {
        "pipeline": pipeline,
        "claim": claim_json(claim),
        "windows_by_state": dict(sorted(by_state.items())),
        "windows": [{
            "start": iso(w.start), "end": iso(w.end), "state": state(w), "epoch": w.epoch,
            "attempts": {str(s): n for s, n in sorted(counts.get(w.start, {}).items(), key=_life_order)},
            "published_rows": w.published_rows, "dead_letter_rows": w.dead_letter_rows,
            "committed_at": iso(w.committed_at),
        } for w in windows],
        "kafka": kafka_config is not None,
        "partitions": [{
            "topic": tp.topic, "partition": tp.partition, "committed_offset": offsets.get(tp),
            "end_of_log": ends.get(tp),
            "lag": ends[tp] - offsets[tp] if tp in ends and tp in offsets else None,
        } for tp in tps],
    }


def claim_json(claim: Claim | None) -> dict[str, Any] | None:
    if claim is None:
        return None
    return {"dag_id": claim.dag_id, "topics": list(claim.topics), "target": claim.target,
            "target_exclusive": claim.target_exclusive}


def print_status(status: dict[str, Any], out: TextIO, *, limit: int = 50) -> None:
    windows = status["windows"]
    shown = windows[-limit:] if limit > 0 else windows
    print(f"pipeline {status['pipeline']}: {len(windows)} window(s), "
          + ", ".join(f"{n} {state}" for state, n in status["windows_by_state"].items()), file=out)
    claim = status["claim"]
    if claim is None:
        print("not claimed yet: its next plan claims it", file=out)
    else:
        owner = Claim(status["pipeline"], tuple(claim["topics"]), claim["dag_id"], claim["target"],
                      claim["target_exclusive"]).owner()
        print(f"claimed by {owner}", file=out)
    unpublished = status["windows_by_state"].get(UNPUBLISHED)
    if unpublished:
        print(UNPUBLISHED_ADVICE.format(n=unpublished), file=out)
    if len(shown) < len(windows):
        print(f"showing the latest {len(shown)}; --limit 0 shows all", file=out)
    print(file=out)
    print(table(
        ["start (UTC)", "end (UTC)", "state", "epoch", "attempts", "rows", "dead letters", "committed at (UTC)"],
        [(_utc(w["start"]), _utc(w["end"]), w["state"], w["epoch"], _attempts(w["attempts"]), w["published_rows"],
          w["dead_letter_rows"], _utc(w["committed_at"])) for w in shown]), file=out)
    print(file=out)
    kafka = status["kafka"]
    headers = ["partition", "committed offset"] + (["end of log", "lag"] if kafka else [])
    rows = [[str(TopicPartition(p["topic"], p["partition"])), p["committed_offset"]]
            + ([p["end_of_log"], p["lag"]] if kafka else []) for p in status["partitions"]]
    print(table(headers, rows) if rows else "no partitions planned yet", file=out)
    if not kafka:
        print("(pass --kafka-bootstrap, --kafka-config or --kafka-conn-id to see the end of each log and the lag)",
              file=out)


def require_ledger(conn: psycopg.Connection, ledger: Ledger) -> None:
    """Refuse, in words, a database where airflow-eos never ran (rather than
    fail on the first query with the server's "relation does not exist")."""
    if not ledger.has_tables(conn, "eos.windows", "eos.attempts"):
        raise UsageError(f"no airflow-eos ledger in {redact(ledger.url)}: schema eos is missing")


def _life_order(item: tuple[attempts.AttemptState, int]) -> int:
    return ATTEMPT_STATES.index(item[0])


def _attempts(states: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in states.items()) or "-"


def _utc(value: str | None) -> str | None:
    """An ISO timestamp of the JSON document as the table shows it."""
    return None if value is None else value[:19].replace("T", " ")


# --------------------------------------------------------------------------- release


def cmd_release(args, out: TextIO) -> int:
    ledger = Ledger(postgres_url(args)[0])
    with ledger.connect() as conn, conn.transaction():
        if not ledger.has_tables(conn, "eos.pipelines"):
            raise UsageError(f"no airflow-eos ledger in {redact(ledger.url)}: schema eos is missing")
        if not ledger.has_pipeline(conn, args.pipeline):
            known = ledger.pipelines(conn, limit=20)
            raise UsageError(f"pipeline {args.pipeline!r} is not in the ledger of {redact(ledger.url)}"
                             + (f"; it knows: {', '.join(known)}" if known else ""))
        released = ledger.release(conn, args.pipeline) if ledger.records_claims(conn) else None
    if released is None:
        print(f"pipeline {args.pipeline!r} has no claim to release; its next plan claims it", file=out)
    else:
        print(f"released {released.describe()}; the next plan of pipeline {args.pipeline!r} claims it again",
              file=out)
    return OK
