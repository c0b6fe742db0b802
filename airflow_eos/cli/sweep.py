"""``airflow-eos sweep``: abort attempts left open too long (zombies)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

from airflow_eos.cli.connections import OK, Connections, resolve
from airflow_eos.cli.output import table, when
from airflow_eos.cli.status import require_ledger
from airflow_eos.cli.targets import UnknownTarget, bound, spec_for
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.sweep import SweepReport, sweep_report
from airflow_eos.core.target import legacy_target

# What the sink of pipelines claimed for no target is named by: its sweep never
# reads its target, only the ledger and the staging.
UNCLAIMED = "eos.windows"


def cmd_sweep(args, out: TextIO) -> int:
    conns = resolve(args)
    url = conns.postgres_url
    ledger = Ledger(url)
    now = datetime.now(timezone.utc)
    cutoff = now - args.older_than
    with ledger.connect() as conn, conn.transaction():
        require_ledger(conn, ledger)
        claims = ledger.records_claims(conn)
        claimed = dict(conn.execute("SELECT pipeline, target FROM eos.pipelines WHERE target IS NOT NULL")
                       .fetchall()) if claims else {}
    # Each target's sink sweeps its own pipelines' attempts (a sink can drop
    # only its own staging). Pipelines claimed for no target (planned before
    # claims) are the legacy kind's (core.target.LEGACY_KIND), like --table.
    if args.table:
        sinks = [bound(legacy_target(args.table), conns).sink()]
    else:
        sinks, unknown = _sweep_sinks(sorted(set(claimed.values())), conns)
        for target, why in unknown:
            print(f"not swept: target {target} ({why})", file=out)
        sinks.append(bound(legacy_target(UNCLAIMED), conns).sink())
    reports = [sweep_report(sink, args.older_than, now=now, dry_run=args.dry_run) for sink in sinks]
    scope = f"of target {sinks[0].target_id} " if args.table else ""
    if all(r.empty for r in reports):
        print(f"nothing to sweep: no live attempt {scope}opened before {when(cutoff)} UTC, no decided window "
              "to finish", file=out)
        return OK
    print_sweep(reports, claimed, cutoff, out)
    return OK


def print_sweep(reports: Sequence[SweepReport], claimed: dict[str, str], cutoff: datetime, out: TextIO) -> None:
    """What the sweep did (a dry run: would do), in the same words either way:
    attempts aborted, decided windows finished, attempts left live."""
    dry = any(r.dry_run for r in reports)

    def rows(field: str) -> list[tuple]:
        return [(a.pipeline, a.window_start, a.window_end, a.epoch, a.staging,
                 claimed.get(a.pipeline) or f"(no claim; as {r.target})") for r in reports for a in getattr(r, field)]

    columns = ["pipeline", "window start (UTC)", "window end (UTC)", "epoch", "staging", "target"]
    aborted, finished, left = rows("aborted"), rows("finished"), rows("left")
    print(f"{'would abort' if dry else 'aborted'} {len(aborted)} attempt(s) opened before {when(cutoff)} UTC"
          + (":" if aborted else ""), file=out)
    if aborted:
        print(table(columns, aborted), file=out)
    if finished:
        print(f"{'would finish' if dry else 'finished'} publishing {len(finished)} decided window(s) (a commit "
              "that died after its decision; epoch: the committed attempt):", file=out)
        print(table(columns, finished), file=out)
    if left:
        print(f"left {len(left)} attempt(s) live: they could not be aborted now (the log says why; the next sweep "
              "tries again):", file=out)
        print(table(columns, left), file=out)


def _sweep_sinks(targets: Sequence[str], conns: Connections) -> tuple[list[Any], list[tuple[str, str]]]:
    """The sinks of the targets claimed in the ledger (each from its target id,
    with the ledger's database; a Kafka topic's with its cluster, given raw
    for the connection --kafka-conn-id names or read from its Airflow
    connection), and the ids airflow-eos cannot build one of, with why."""
    sinks: list[Any] = []
    unknown = []
    for target in targets:
        try:
            sinks.append(spec_for(target, conns).sink())
        except UnknownTarget as exc:
            unknown.append((target, str(exc)))
    return sinks, unknown
