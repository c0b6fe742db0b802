"""``airflow-eos resolve``: a person's answer for a Kafka-target commit that
nobody can settle any more (its marker expired and the topic's records that
would prove it were deleted; see intent.py). The error the commit raised
prints the exact command. The CLI adds it as this kind's command
(``KafkaTarget.commands``, core/target.py's ``TargetCommand``)."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TextIO

from airflow_eos.core.database import redact
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.target import TargetCommand
from airflow_eos.targets.kafka import intent as intents


def _add_arguments(settle: argparse.ArgumentParser) -> None:
    settle.add_argument("--pipeline", required=True, help="the pipeline id")
    settle.add_argument("--window-start", required=True, metavar="TIMESTAMP",
                        help="the window's start, ISO 8601 with its zone, as the error prints it")
    settle.add_argument("--token", required=True, type=int, help="the commit token the error names")
    answer = settle.add_mutually_exclusive_group(required=True)
    answer.add_argument("--committed", action="store_true", help="the transaction committed")
    answer.add_argument("--aborted", action="store_true", help="the transaction aborted")


def _resolve(ledger_url: str, args: argparse.Namespace, out: TextIO) -> int:
    ledger = Ledger(ledger_url)
    outcome = intents.COMMITTED if args.committed else intents.ABORTED
    start = _timestamp(args.window_start)
    with ledger.connect() as conn, conn.transaction():
        if not ledger.has_tables(conn, "eos.kafka_intents"):
            raise ConfigurationError(f"no Kafka commit intents in the ledger of {redact(ledger.url)} (schema eos is "
                                     "missing or older than this airflow-eos)")
        changed = intents.answer(conn, args.pipeline, start, args.token, outcome,
                                 f"answered {outcome} by a person (airflow-eos resolve)")
    if not changed:
        raise ConfigurationError(f"pipeline {args.pipeline!r}, window {start.isoformat()}: no unsettled commit intent "
                                 f"with token {args.token} (settled already, or another window or token: copy them "
                                 "from the commit's error)")
    then = ("its next commit, teardown or sweep records the window committed by that attempt" if args.committed
            else "its next commit publishes the window")
    print(f"recorded: the Kafka transaction with commit token {args.token} of pipeline {args.pipeline!r}, window "
          f"{start.isoformat()}, {outcome}; {then} (clear the window's run)", file=out)
    return 0


def _timestamp(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(f"--window-start {text!r} is not an ISO timestamp like "
                                 "2024-01-01T00:00:00+00:00") from None
    if when.tzinfo is None:
        raise ConfigurationError(f"--window-start {text!r} has no time zone: copy it from the commit's error "
                                 "(e.g. 2024-01-01T00:00:00+00:00)")
    return when


RESOLVE = TargetCommand(
    name="resolve",
    help="answer for a Kafka-target commit nobody can settle any more",
    description="A Kafka-target commit that died after its Kafka transaction began, whose window's marker "
                "(consumer-group offsets) Kafka has since expired and whose records in the topic were "
                "deleted, cannot be settled: its next commit, teardown or sweep refuses, printing this "
                "command with the window and the commit token. Tell the ledger what the topic's readers "
                "received: --committed (records with that eos-commit header were delivered; the window is "
                "then recorded as committed, not published again) or --aborted (they were not; the next "
                "commit publishes the window). A wrong answer loses or duplicates the window.",
    add_arguments=_add_arguments,
    run=_resolve,
)
