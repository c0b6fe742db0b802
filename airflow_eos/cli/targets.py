"""A pipeline's target as the ledger records it (its claim's target identity,
e.g. ``postgresql:analytics.orders``), turned back into a bound target spec
for ``verify`` and ``sweep``."""

from __future__ import annotations

from typing import Any

from airflow_eos.cli.connections import Connections, UsageError
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.target import TargetSpec, target_from_dict

# The prefix of a target identity -> the target kind whose spec it names.
KIND_OF_SCHEME = {"postgresql": "postgres", "files": "files", "kafka": "kafka"}


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
    scheme, _, name = target_id.partition(":")
    kind = KIND_OF_SCHEME.get(scheme)
    fields: dict[str, Any] = {"kind": kind}
    if kind == "postgres":
        fields.update(table=name, url=conns.postgres_url)
    elif kind == "files":
        fields.update(path=name, ledger_url=conns.postgres_url)
    elif kind == "kafka":
        conn_id, _, topic = name.partition("/")
        try:
            config = conns.target_kafka_config(conn_id)
        except UsageError as exc:
            raise UnknownTarget(str(exc)) from None
        if config is None:
            raise UnknownTarget(f"its cluster is not given: pass --kafka-conn-id {conn_id} with its "
                                "--kafka-bootstrap or --kafka-config, or --postgres-conn-id to read the Airflow "
                                f"connection {conn_id!r}")
        fields.update(topic=topic, kafka_conn_id=conn_id, ledger_url=conns.postgres_url, kafka_config=config)
    else:
        raise UnknownTarget("airflow-eos cannot build its sink from its identity; use the Python API "
                            "(airflow_eos.verify.verify, Sink.sweep) with the target's spec")
    return target_from_dict(fields)
