"""A pipeline's target as the ledger records it (its claim's target identity,
e.g. ``postgresql:analytics.orders``), turned back into a bound target spec
for ``verify`` and ``sweep``: the target registry (core/target.py) builds the
spec of an identity, and the CLI binds its connections."""

from __future__ import annotations

from typing import Any

from airflow_eos.cli.connections import Connections, UsageError
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.target import KAFKA, POSTGRES, TargetSpec, spec_of_target_id


class UnknownTarget(Exception):
    """A recorded target the CLI cannot build a spec of (a third-party kind,
    or a Kafka cluster it was not given); the message says why."""


def recorded_target(ledger: Ledger, pipeline: str) -> str | None:
    """The target identity the pipeline's claim records; None when it records
    none (no claim: never planned, planned before claims, or released; or a
    claim whose plan named no target)."""
    from airflow_eos.cli.status import require_ledger  # the one check of "is this a ledger"

    with ledger.connect() as conn:
        require_ledger(conn, ledger)
        claim = ledger.load_claim(conn, pipeline) if ledger.records_claims(conn) else None
    return claim.target if claim is not None and claim.target else None


def claimed_target(ledger: Ledger, pipeline: str) -> str:
    """The target identity the pipeline's claim records; a UsageError saying
    what to pass when it records none."""
    recorded = recorded_target(ledger, pipeline)
    if recorded is None:
        raise UsageError(f"pipeline {pipeline!r} has no claim naming its target in the ledger (never planned by a "
                         "DAG, planned without its target, or released), so its target is not known: name it with "
                         "--table, --topic (a Kafka target) or --path (a file target's root)")
    return recorded


def named_target(args: Any, conns: Connections) -> str | None:
    """The target identity the CLI's --table / --topic / --path name (as a
    claim records it: ``postgresql:table``, ``kafka:conn_id/topic``,
    ``files:/root``); None when none is given."""
    if getattr(args, "table", None):
        return f"postgresql:{args.table}"
    if getattr(args, "topic", None):
        return f"kafka:{conns.kafka_conn_id}/{args.topic}"
    if getattr(args, "path", None):
        return f"files:{args.path}"
    return None


def spec_for(target_id: str, conns: Connections) -> TargetSpec:
    """The bound spec of a recorded target identity, its ledger this database.
    Raises UnknownTarget when it cannot be built."""
    spec = spec_of_target_id(target_id)
    if spec is None:
        raise UnknownTarget("airflow-eos cannot build its sink from its identity; use the Python API "
                            "(airflow_eos.verify.verify, Sink.sweep) with the target's spec")
    return bound(spec, conns)


def bound(spec: TargetSpec, conns: Connections) -> TargetSpec:
    """``spec`` with the CLI's connections: this database for each PostgreSQL
    one (the ledger's, which a target's data shares or sits beside), the
    cluster given for each Kafka one. Raises UnknownTarget when one is not
    given."""
    values: dict[str, Any] = {}
    for ref in spec.connections():
        if ref.conn_type == POSTGRES:
            values[ref.role] = conns.postgres_url
        elif ref.conn_type == KAFKA:
            values[ref.role] = _kafka_config(ref.conn_id, conns)
        else:
            raise UnknownTarget(f"it needs the connection {ref.conn_id!r} of type {ref.conn_type!r}, which the "
                                "CLI cannot resolve")
    return spec.bind(values)


def _kafka_config(conn_id: str, conns: Connections) -> dict[str, Any]:
    """The configuration of the cluster the Kafka connection ``conn_id`` names."""
    try:
        config = conns.target_kafka_config(conn_id)
    except UsageError as exc:
        raise UnknownTarget(str(exc)) from None
    if config is None:
        raise UnknownTarget(f"its cluster is not given: pass --kafka-conn-id {conn_id} with its "
                            "--kafka-bootstrap or --kafka-config, or --postgres-conn-id to read the Airflow "
                            f"connection {conn_id!r}")
    return config
