"""Where the CLI finds the ledger's database and Kafka: raw URLs, or Airflow
connection ids resolved the way the operators resolve them (the package's hooks,
so ``AIRFLOW_CONN_*`` variables and configured secrets backends work).

Precedence, per service: ``--postgres-url`` / ``--kafka-bootstrap`` or
``--kafka-config``; then ``--postgres-conn-id`` / ``--kafka-conn-id``; then
``$EOS_POSTGRES_URL`` / ``$EOS_KAFKA_BOOTSTRAP``; then the default Airflow
connection (``postgres_default``, ``kafka_default``). Airflow is imported only
when a connection id is resolved: with URLs the CLI runs without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from airflow_eos.core.database import redact
from airflow_eos.core.target import DEFAULT_CONN_IDS, KAFKA, POSTGRES, ConnectionRef

# Exit codes, documented in the parser's epilog, the README and docs/cli.md.
OK, VIOLATIONS, USAGE = 0, 1, 2
POSTGRES_URL_ENV, KAFKA_BOOTSTRAP_ENV = "EOS_POSTGRES_URL", "EOS_KAFKA_BOOTSTRAP"


class UsageError(Exception):
    """A problem with what was asked; reported on stderr, exit code 2."""


def connection_options(*, kafka: bool) -> argparse.ArgumentParser:
    """The connection arguments a subcommand takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="log what the core does (to stderr)")
    group = common.add_argument_group(
        "connections", "a URL, or an Airflow connection id resolved as the operators resolve it (AIRFLOW_CONN_* "
                       "variables, secrets backends); default: $EOS_POSTGRES_URL / $EOS_KAFKA_BOOTSTRAP, else the "
                       "Airflow connections postgres_default / kafka_default")
    pg = group.add_mutually_exclusive_group()
    pg.add_argument("--postgres-url", metavar="URL",
                    help="the target database, which holds the ledger (schema eos): a libpq URL or conninfo, "
                         "a SQLAlchemy URL (postgresql+psycopg2://...) or jdbc:postgresql://...")
    pg.add_argument("--postgres-conn-id", metavar="CONN_ID",
                    help="the Airflow connection of the target database (the DAG's postgres_conn_id)")
    if not kafka:
        return common
    group.add_argument("--kafka-bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    group.add_argument("--kafka-config", metavar="JSON",
                       help='librdkafka settings as a JSON object, e.g. \'{"security.protocol": "SSL"}\'; '
                            "--kafka-bootstrap overrides its bootstrap.servers")
    group.add_argument("--kafka-conn-id", metavar="CONN_ID",
                       help="the Airflow connection of the source topics' cluster (the DAG's kafka_conn_id); with "
                            "--kafka-bootstrap / --kafka-config: the connection whose cluster they give, for a "
                            "Kafka target published through it (default: kafka_default)")
    group.add_argument("--kafka-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="give up when Kafka does not answer for this long (default: %(default)s)")
    return common


@dataclass(frozen=True)
class Connections:
    """What one command was given: the ledger's URL, the source's Kafka
    configuration (None: not given), and whether connection ids resolve
    through Airflow (the ledger came from an Airflow connection, or a Kafka
    connection id was named)."""

    postgres_url: str
    kafka_config: dict[str, Any] | None
    kafka_conn_id: str
    via_airflow: bool

    def target_kafka_config(self, conn_id: str) -> dict[str, Any] | None:
        """The cluster of a Kafka target published through ``conn_id``: the
        raw configuration given for that connection, else (with Airflow) the
        connection itself; None when neither is known."""
        if conn_id == self.kafka_conn_id and self.kafka_config is not None:
            return self.kafka_config
        if self.via_airflow:
            return airflow_connection(ConnectionRef("kafka", KAFKA, conn_id), "a Kafka target's cluster")
        return None


def postgres_url(args: argparse.Namespace) -> tuple[str, bool]:
    """The ledger database's URL, and whether it came through Airflow."""
    if args.postgres_url:
        url, via_airflow = args.postgres_url, False
    elif not args.postgres_conn_id and os.environ.get(POSTGRES_URL_ENV):
        url, via_airflow = os.environ[POSTGRES_URL_ENV], False
    else:
        conn_id = args.postgres_conn_id or DEFAULT_CONN_IDS[POSTGRES]
        given = "--postgres-conn-id" if args.postgres_conn_id else "no database given: pass --postgres-url, " \
            f"--postgres-conn-id or set {POSTGRES_URL_ENV}; the default"
        url, via_airflow = airflow_connection(ConnectionRef("ledger", POSTGRES, conn_id), given), True
    args.resolved_secrets = [*getattr(args, "resolved_secrets", []), url]
    return url, via_airflow


def kafka_config(args: argparse.Namespace, *, required: bool, airflow_default: bool) -> dict[str, Any] | None:
    """The source cluster's librdkafka configuration, or None when not given
    and not ``required``. ``airflow_default``: fall back to the default Kafka
    connection (as the DAG would) when nothing else is given."""
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
    if config.get("bootstrap.servers"):
        return _remembered(args, config)
    if args.kafka_config or args.kafka_bootstrap:
        raise UsageError("--kafka-config names no bootstrap.servers: add it or pass --kafka-bootstrap")
    if args.kafka_conn_id:
        return _remembered(args, airflow_connection(ConnectionRef("kafka", KAFKA, args.kafka_conn_id),
                                                    "--kafka-conn-id"))
    if os.environ.get(KAFKA_BOOTSTRAP_ENV):
        return {"bootstrap.servers": os.environ[KAFKA_BOOTSTRAP_ENV]}
    if not (required or airflow_default):
        return None
    ref = ConnectionRef("kafka", KAFKA, DEFAULT_CONN_IDS[KAFKA])
    given = ("no Kafka given: pass --kafka-bootstrap, --kafka-config, --kafka-conn-id or set "
             f"{KAFKA_BOOTSTRAP_ENV}; the default")
    try:
        return _remembered(args, airflow_connection(ref, given))
    except UsageError:
        if required:
            raise
        return None


def resolve(args: argparse.Namespace, *, kafka_required: bool = False) -> Connections:
    """The connections of a command with Kafka options (status, verify, sweep)."""
    url, via_airflow = postgres_url(args)
    config = kafka_config(args, required=kafka_required, airflow_default=via_airflow)
    return Connections(url, config, args.kafka_conn_id or DEFAULT_CONN_IDS[KAFKA],
                       via_airflow or bool(args.kafka_conn_id))


def airflow_connection(ref: ConnectionRef, given: str) -> Any:
    """The value of an Airflow connection, as the operators read it (the
    package's hooks); a UsageError naming the connection when it cannot be
    read. ``given`` says where its id came from, for the message."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        from airflow_eos.hooks.eos import connection_value  # imports Airflow: only when an id is resolved
    except ImportError as exc:
        raise UsageError(f"{given} Airflow connection {ref.conn_id!r} cannot be read: Airflow is not installed "
                         f"here ({exc.name}); pass a URL instead") from None
    finally:
        # Importing Airflow configures logging: the root logger to stdout at INFO. The CLI's
        # stdout is its report (-o json is parsed by scripts): keep the CLI's own logging.
        root.handlers[:] = handlers
        root.setLevel(level)
    try:
        return connection_value(ref)
    except Exception as exc:  # Airflow's lookup raises its own types (AirflowNotFoundException, ...)
        variable = "AIRFLOW_CONN_" + ref.conn_id.upper()
        raise UsageError(f"{given} Airflow connection {ref.conn_id!r} ({ref.conn_type}) cannot be read: "
                         f"{redact(str(exc))}; define it (e.g. {variable}, or in a secrets backend "
                         "Airflow is configured with) or pass a URL") from None


def _remembered(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """``config``, its secret values kept on ``args`` for redacted()."""
    secret = [str(v) for k, v in config.items() if _SECRET_KEY.search(k) and v]
    args.resolved_secrets = [*getattr(args, "resolved_secrets", []), *secret]
    return config


def redacted(text: str, args: argparse.Namespace) -> str:
    """The last line of defence for an error message: every password of a
    connection string masked, and every secret the command was given or read
    from a connection (the database's password, a Kafka sasl.password, ...)."""
    for secret in getattr(args, "resolved_secrets", []):
        text = redact(text, secret) if "=" in secret or "://" in secret else text.replace(secret, "***")
    return redact(text, getattr(args, "postgres_url", None))


# librdkafka settings that hold secrets (sasl.password, ssl.key.password, ssl.keystore.password, ...).
_SECRET_KEY = re.compile(r"password|secret|token|credential|ssl\.key\.pem", re.IGNORECASE)
