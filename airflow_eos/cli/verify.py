"""``airflow-eos verify``: prove a pipeline's target against Kafka."""

from __future__ import annotations

import sys
from typing import TextIO

import psycopg

from airflow_eos.cli.connections import OK, VIOLATIONS, Connections, UsageError, resolve
from airflow_eos.cli.output import JSON, print_json, table
from airflow_eos.cli.targets import UnknownTarget, claimed_target, named_target, recorded_target, spec_for
from airflow_eos.core.database import redact
from airflow_eos.core.errors import LedgerUnavailable
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.target import TargetSpec
from airflow_eos.verify import OFFSETS, VerifyReport, verify
from airflow_eos.verify.report import SOURCE_EXPIRED, VIOLATION, window_result


def cmd_verify(args, out: TextIO) -> int:
    conns = resolve(args, kafka_required=True)
    ledger = Ledger(conns.postgres_url)
    target = verified_target(args, conns, ledger)
    report = verify(ledger, conns.kafka_config, target, args.pipeline, count_column=args.count_column,
                    max_examples=args.max_examples, timeout=args.kafka_timeout,
                    max_timestamp_skew=args.max_timestamp_skew)
    record_last_verify(ledger, report)
    if args.output == JSON:
        print_json(report.to_dict(), out)
    else:
        print_report(report, out, limit=args.limit)
    return OK if report.clean else VIOLATIONS


def verified_target(args, conns: Connections, ledger: Ledger) -> TargetSpec:
    """The bound spec verify audits: the target --table / --topic / --path
    names, else the one the pipeline's claim records. A named target the
    pipeline is claimed for another than is refused, naming the claimed one:
    auditing it would report every record of the pipeline as missing."""
    named = named_target(args, conns)
    recorded = claimed_target(ledger, args.pipeline) if named is None else recorded_target(ledger, args.pipeline)
    try:
        spec = spec_for(named or recorded, conns)
    except UnknownTarget as exc:
        raise UsageError(f"cannot verify target {named or recorded} of pipeline {args.pipeline!r}: {exc}") from None
    if named is not None and recorded is not None and spec.target_id != recorded:
        raise UsageError(f"pipeline {args.pipeline!r} is claimed for target {recorded}, not {spec.target_id}: its "
                         f"windows are published there; verify it without --table/--topic/--path (the claimed "
                         f"target), or, if the pipeline moved on purpose, `airflow-eos release` it first")
    return spec


def record_last_verify(ledger: Ledger, report: VerifyReport) -> None:
    """Keep the report's totals as the pipeline's last verify (the window status
    page shows it). Verify itself only reads: a ledger user without write access
    loses the record, not the audit."""
    try:
        ledger.record_verify_run(report.pipeline, report.run_record())
    except (psycopg.Error, LedgerUnavailable) as exc:
        print(f"airflow-eos verify: note: the result was not recorded in the ledger ({type(exc).__name__}: "
              f"{redact(str(exc)).splitlines()[0] if str(exc) else ''})", file=sys.stderr)


def print_report(report: VerifyReport, out: TextIO, *, limit: int = 50) -> None:
    kind = "record lineage" if report.lineage else "aggregate: counts per window"
    print(f"verify {report.pipeline} against {report.table} ({kind}) in {report.seconds:.1f}s", file=out)
    print(file=out)
    flagged = {x.window_start for x in report.violations}
    clean = [a for a in report.windows if a.window_start not in flagged]
    keep = {id(a) for a in (clean[-limit:] if limit > 0 else clean)}
    shown = [a for a in report.windows if a.window_start in flagged or id(a) in keep]
    t = report.totals
    rows = [(a.window_start, a.shown_state, a.kafka_records, a.published_rows, a.dead_letters, a.duplicates, a.missing,
             a.extra, _result(window_result(a, flagged, report.expired_windows))) for a in shown]
    rows.append(("total", "", t.kafka_records, t.published_rows, t.dead_letters, t.duplicates, t.missing,
                 t.extra, ""))
    print(table(["window start (UTC)", "state", "kafka records", "published", "dead letters", "duplicates",
                 "missing", "extra", "result"], rows), file=out)
    if len(shown) < len(report.windows):
        print(f"({len(report.windows) - len(shown)} older clean window(s) not shown; --limit 0 shows all)", file=out)
    print(file=out)
    offsets_wrong = sum(x.kind == OFFSETS for x in report.violations)
    print(f"partition offsets: {len(report.expected_offsets)} partition(s) in the contiguous committed prefix, "
          + ("eos.partition_offsets matches" if not offsets_wrong else f"{offsets_wrong} wrong"), file=out)
    print_not_checkable(report, out)
    if report.clean:
        proof = "is published exactly once or is a dead letter" if report.lineage else "is counted as the ledger says"
        print(f"CLEAN: every record of {report.committed_windows} committed window(s) {proof}", file=out)
        return
    print(f"VIOLATIONS: {len(report.violations)}", file=out)
    for x in report.violations:
        print(f"  {x.kind:<18} {x.message}", file=out)


def print_not_checkable(report: VerifyReport, out: TextIO) -> None:
    """The windows whose source records retention deleted: checked as far as
    they can be (see verify.report.NotCheckable), no violation."""
    if not report.not_checkable:
        return
    print(f"NO LONGER CHECKABLE AGAINST THE SOURCE: {len(report.expired_windows)} committed window(s); their rows "
          "were checked for duplicates, their windows' ranges and the ledger's counts, not against Kafka's records "
          "(not a violation):", file=out)
    for x in report.not_checkable:
        print(f"  {x}", file=out)


def _result(result: str | None) -> str:
    if result == SOURCE_EXPIRED:
        return "ok, source expired"
    return "VIOLATION" if result == VIOLATION else result or "-"
