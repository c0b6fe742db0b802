"""``airflow-eos resolve``: a person's answer for a Kafka-target commit that
nobody can settle any more (its marker expired and the topic's records that
would prove it were deleted; see airflow_eos/targets/kafka/intent.py). The
error the commit raised prints the exact command."""

from __future__ import annotations

from datetime import datetime
from typing import TextIO

from airflow_eos.cli.connections import OK, UsageError, postgres_url
from airflow_eos.core.database import redact
from airflow_eos.core.ledger import Ledger
from airflow_eos.targets.kafka import intent as intents


def cmd_resolve(args, out: TextIO) -> int:
    ledger = Ledger(postgres_url(args)[0])
    outcome = intents.COMMITTED if args.committed else intents.ABORTED
    start = _timestamp(args.window_start)
    with ledger.connect() as conn, conn.transaction():
        if not ledger.has_tables(conn, "eos.kafka_intents"):
            raise UsageError(f"no Kafka commit intents in the ledger of {redact(ledger.url)} (schema eos is missing "
                             "or older than this airflow-eos)")
        changed = intents.answer(conn, args.pipeline, start, args.token, outcome,
                                 f"answered {outcome} by a person (airflow-eos resolve)")
    if not changed:
        raise UsageError(f"pipeline {args.pipeline!r}, window {start.isoformat()}: no unsettled commit intent with "
                         f"token {args.token} (settled already, or another window or token: copy them from the "
                         "commit's error)")
    then = ("its next commit, teardown or sweep records the window committed by that attempt" if args.committed
            else "its next commit publishes the window")
    print(f"recorded: the Kafka transaction with commit token {args.token} of pipeline {args.pipeline!r}, window "
          f"{start.isoformat()}, {outcome}; {then} (clear the window's run)", file=out)
    return OK


def _timestamp(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--window-start {text!r} is not an ISO timestamp like 2024-01-01T00:00:00+00:00") from None
    if when.tzinfo is None:
        raise UsageError(f"--window-start {text!r} has no time zone: copy it from the commit's error "
                         "(e.g. 2024-01-01T00:00:00+00:00)")
    return when
