"""``airflow-eos sweep``: abort attempts left open too long (zombies)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

from airflow_eos.cli.connections import OK, Connections, resolve
from airflow_eos.cli.output import table, when
from airflow_eos.cli.status import require_ledger
from airflow_eos.cli.targets import UnknownTarget, spec_for
from airflow_eos.core.ledger import Ledger
from airflow_eos.targets.postgres.target import PostgresTarget


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
    # only its own staging). Aborting never reads a PostgreSQL target's table,
    # so the one for pipelines claimed for no target may name any table.
    if args.table:
        sinks = [PostgresTarget(url, args.table)]
    else:
        sinks, unknown = _sweep_sinks(sorted(set(claimed.values())), conns)
        for target, why in unknown:
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
        print(f"nothing to sweep: no live attempt {scope}opened before {when(cutoff)} UTC", file=out)
        return OK
    print(f"{verb} {len(rows)} attempt(s) opened before {when(cutoff)} UTC:", file=out)
    print(table(["pipeline", "window start (UTC)", "window end (UTC)", "epoch", "staging", "target"], rows),
          file=out)
    return OK


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
