"""``airflow-eos``: look at a pipeline's ledger, audit it against Kafka, sweep zombies,
release a pipeline's claim; and each registered target kind's own commands
(core/target.py's ``TargetCommand``: the Kafka target's ``resolve`` answers for
a commit nobody can settle).

Connections are raw URLs (``--postgres-url``, ``--kafka-bootstrap``,
``--kafka-config``: the CLI then runs without Airflow) or Airflow connection ids
(``--postgres-conn-id``, ``--kafka-conn-id``) resolved the way the operators
resolve them; by default ``$EOS_POSTGRES_URL`` / ``$EOS_KAFKA_BOOTSTRAP``, else
the connections ``postgres_default`` / ``kafka_default``, and the pipeline's
target as its claim in the ledger records it. See connections.py.

Exit codes: 0 success (verify: clean), 1 verify found violations, 2 usage,
configuration or connection errors. ``status`` and ``verify`` print JSON with
``-o json`` (keys documented in docs/cli.md).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import TextIO

import psycopg
from confluent_kafka import KafkaException

from airflow_eos.cli.connections import (
    OK,
    USAGE,
    VIOLATIONS,
    UsageError,
    connection_options,
    postgres_url,
    redacted,
)
from airflow_eos.cli.output import output_option
from airflow_eos.cli.status import cmd_release, cmd_status
from airflow_eos.cli.sweep import cmd_sweep
from airflow_eos.cli.verify import cmd_verify
from airflow_eos.core.errors import EosError
from airflow_eos.core.kafka_client import LIBRDKAFKA_LOG
from airflow_eos.core.target import TargetCommand, target_commands

PROG = "airflow-eos"
__all__ = ["main", "build_parser", "parse_duration", "OK", "VIOLATIONS", "USAGE"]
EXIT_CODES = "Exit codes: 0 ok (verify: clean), 1 verify found violations, 2 usage, configuration or connection error."


def parse_duration(text: str) -> timedelta:
    """``45s``, ``30m``, ``2h``, ``1d``, or a sum like ``1h30m``."""
    parts = re.findall(r"(\d+)([smhd])", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30m, 2h or 1h30m")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
    duration = sum((timedelta(**{unit[u]: int(n)}) for n, u in parts), timedelta())
    if duration <= timedelta(0):
        raise argparse.ArgumentTypeError("the duration must be positive")
    return duration


def build_parser() -> argparse.ArgumentParser:
    """The ``airflow-eos`` parser: one sub-command per function below."""
    with_kafka, postgres_only = connection_options(kafka=True), connection_options(kafka=False)
    output = output_option()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exactly-once batch windows over Kafka: inspect a pipeline's ledger, prove what it "
                    "published against Kafka, and abort attempts nobody finished.",
        epilog=EXIT_CODES,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_status(sub, [with_kafka, output])
    _add_verify(sub, [with_kafka, output])
    _add_sweep(sub, [with_kafka])
    _add_release(sub, [postgres_only])
    for command in target_commands():
        _add_target_command(sub, [postgres_only], command)
    _add_demo(sub)
    return parser


def _add_status(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``status``: a pipeline's windows, attempts and offsets."""
    status = sub.add_parser(
        "status", parents=parents, epilog=EXIT_CODES, help="windows, attempts and offsets of a pipeline",
        description="Show a pipeline's windows (state, epoch, attempts per state, published rows, dead letters, "
                    "commit time) and its committed partition offsets. With Kafka, also each partition's end "
                    "of log (read from the log, not the reported high watermark) and the lag behind it.")
    status.add_argument("--pipeline", required=True, help="the pipeline id")
    status.add_argument("--limit", type=int, default=50, metavar="N",
                        help="show the latest N windows (default: %(default)s; 0 shows all)")
    status.set_defaults(run=cmd_status)


def _add_verify(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``verify``: prove a pipeline's target against Kafka."""
    check = sub.add_parser(
        "verify", parents=parents, epilog=EXIT_CODES, help="prove a pipeline's target against Kafka",
        description="Read every committed window's planned ranges from Kafka and prove each record is published "
                    "exactly once in the target (through the lineage columns eos_topic, eos_partition, "
                    "eos_offset) or is a dead letter of the window; no row without a record; row counts and "
                    "partition offsets as the ledger says. A target without lineage columns is checked per "
                    "window by counts. Without --table, --topic or --path, the target is the one the pipeline's "
                    "claim in the ledger records (as its DAG's plan wrote it); a target named while the claim "
                    "records another is refused (exit code 2), naming the claimed one. Exit code 1 on any "
                    "violation.")
    check.add_argument("--pipeline", required=True, help="the pipeline id")
    target = check.add_mutually_exclusive_group()
    target.add_argument("--table", metavar="TABLE",
                        help="the target table, table or schema.table (quote parts as in SQL); default: the "
                             "pipeline's target as the ledger records it")
    target.add_argument("--topic", metavar="TOPIC",
                        help="a Kafka target's topic, published through the connection --kafka-conn-id "
                             "(on the cluster of --kafka-bootstrap / --kafka-config, or the Airflow connection) "
                             "(read to its end with read_committed; records count by the commits the ledger "
                             "records)")
    target.add_argument("--path", metavar="ROOT",
                        help="a file target's root directory (FileTarget path: an absolute path or file:///...), "
                             "its ledger this database")
    check.add_argument("--count-column", metavar="COLUMN",
                       help="aggregate targets: a column whose per-window sum plus dead letters must equal the "
                            "window's records in Kafka")
    check.add_argument("--max-examples", type=int, default=20, metavar="N",
                       help="list at most N violations of each kind per window (default: %(default)s); "
                            "counts stay exact")
    check.add_argument("--max-timestamp-skew", type=parse_duration, default=timedelta(hours=1), metavar="DURATION",
                       help="the pipeline's max_timestamp_skew (default: 1h): a partition whose last committed "
                            "end cut is a record stamped more than this beyond its window's end, with older records "
                            "after it, is reported as held")
    check.add_argument("--limit", type=int, default=50, metavar="N",
                       help="show at most N clean windows in the table, the latest (default: %(default)s; "
                            "0 shows all); windows with violations are always shown")
    check.set_defaults(run=cmd_verify)


def _add_sweep(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``sweep``: abort attempts left open too long."""
    sweep = sub.add_parser(
        "sweep", parents=parents, epilog=EXIT_CODES, help="abort attempts left open too long (zombies)",
        description="Abort every attempt still open, checkpointed or prepared that was opened longer ago than "
                    "--older-than, and drop its staging. Its window stays planned and can run again. The "
                    "duration must exceed the longest stage-to-commit time of a healthy run. Each target "
                    "claimed in the ledger (a PostgreSQL table, a file target's root, a Kafka topic) is swept by "
                    "its own sink; pipelines claimed for no target (planned before claims, or without their "
                    "target) are swept as PostgreSQL ones. A Kafka topic's sink first finishes the window of a "
                    "commit that died after the Kafka commit (recorded as committed, not aborted) and fences "
                    "its producers (ending a transaction a dead committer left open): it needs the topic's "
                    "cluster: the Airflow connection the target names (with --postgres-conn-id or "
                    "--kafka-conn-id), or --kafka-bootstrap / --kafka-config for the connection --kafka-conn-id "
                    "names (default kafka_default). A file root's sink also publishes windows whose commit was "
                    "decided but not completed. The output lists attempts aborted, decided windows finished and "
                    "attempts left live, with --dry-run in the same form.")
    sweep.add_argument("--older-than", required=True, type=parse_duration, metavar="DURATION",
                       help="e.g. 30m, 2h, 1d or 1h30m")
    sweep.add_argument("--table", metavar="TABLE",
                       help="sweep only the pipelines claimed for this PostgreSQL table, and those claimed for "
                            "no target (aborting only drops their staging; the table itself is never touched)")
    sweep.add_argument("--dry-run", action="store_true",
                       help="list what the sweep would do (attempts to abort, decided windows to finish), "
                            "change nothing")
    sweep.set_defaults(run=cmd_sweep)


def _add_release(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``release``: forget a pipeline's claim."""
    release = sub.add_parser(
        "release", parents=parents, epilog=EXIT_CODES,
        help="forget which DAG, topics and target own a pipeline",
        description="A pipeline's first plan claims it for its DAG, its topics and its target; every later plan "
                    "must match, so that a second DAG with the same pipeline id, or a second pipeline sending "
                    "the same topics into the target, is refused. After a deliberate move (the DAG renamed, the "
                    "pipeline given other topics or another target), release the claim once: the next plan "
                    "claims the pipeline again. Windows, cuts and offsets stay; windows planned before keep "
                    "their topics. Release only after the old DAG is gone or changed, or it claims again first.")
    release.add_argument("--pipeline", required=True, help="the pipeline id")
    release.set_defaults(run=cmd_release)


def _add_target_command(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser],
                        command: TargetCommand) -> None:
    """A target kind's own command (the Kafka target's ``resolve``, ...), on the ledger's database."""
    parser = sub.add_parser(command.name, parents=parents, epilog=EXIT_CODES, help=command.help,
                            description=command.description)
    command.add_arguments(parser)
    parser.set_defaults(run=lambda args, out: command.run(postgres_url(args)[0], args, out))


def _add_demo(sub: argparse._SubParsersAction) -> None:
    """``demo``: the example pipeline end to end on embedded services."""
    demo = sub.add_parser(
        "demo", help="run the example pipeline end to end on embedded services (what `make demo` runs)",
        description="Start a throwaway PostgreSQL and an Apache Kafka broker on 127.0.0.1, produce "
                    "four hours of orders (with malformed and late records), run the example DAG orders_hourly "
                    "for every hourly window through Airflow and spark-submit, crash one window and recover it "
                    "with a Clear, rerun a committed window, and audit the result with verify. Stops everything "
                    "it started. The DAG ships in the package; Apache Kafka's jars are where EOS_KAFKA_HOME says "
                    "(default ~/.cache/airflow-eos/kafka-<version>; `make setup` fetches them with Maven).")
    demo.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)
    demo.set_defaults(run=lambda args, out: _demo())


def _demo() -> int:
    from airflow_eos.demo import main as demo_main  # imports Airflow; only the demo needs it

    return demo_main()


# --------------------------------------------------------------------------- entry point


def _log_to(err: TextIO, *, verbose: bool) -> None:
    """Log to ``err`` (where no logging is configured yet: the console script).
    The Kafka clients' own records (``airflow_eos.librdkafka``: a refused
    connection, "1/1 brokers are down") only with ``-v``: an error that gives up
    on the cluster already names the last of them, in its one line."""
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    if not verbose:
        handler.addFilter(lambda record: record.name != LIBRDKAFKA_LOG.name)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else USAGE
    _log_to(err, verbose=args.verbose)
    try:
        return args.run(args, out)
    except (UsageError, EosError, psycopg.Error, KafkaException) as exc:
        # The core redacts what it raises; this is the last line of defence for
        # a driver's message that quotes the URL it was given.
        print(f"{PROG} {args.command}: error: {redacted(str(exc), args)}", file=err)
        return USAGE
