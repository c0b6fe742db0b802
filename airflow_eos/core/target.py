"""A target: a serializable spec that builds its runtime Sink.

The DAG author builds a spec (``PostgresTarget(table=..., postgres_conn_id=...)``).
The spec is plain values, and travels in one format, :meth:`TargetSpec.to_dict`
(``{"kind": "postgres", ...}``): to triggers, into the spark-submit environment,
into Spark Connect options, into XCom. It names the Airflow connections it needs
(:meth:`TargetSpec.connections`) without reading them: the hook layer resolves
each one into a value (a libpq URL, a librdkafka config) where the connection
can be read, and :meth:`TargetSpec.bind` returns the spec with those values,
from which :meth:`TargetSpec.sink` builds the runtime
:class:`~airflow_eos.core.sink.Sink`.

Operators, the sensor, the triggers, the steps, ``verify`` and the CLI know
only this interface and this registry; no ``isinstance`` on a concrete target,
no kind named, outside its own package. A new target is a package under
``airflow_eos/targets/`` with a spec class whose ``kind`` is registered in
core/registry.py (or by a third-party package, under the entry point group
``airflow_eos.targets``). The registry finds a spec class by its kind
(:func:`spec_class`, :func:`target_from_dict`) or by the scheme of a target
identity as a pipeline's claim records it (:func:`spec_of_target_id`).
A kind may also bring its own ``airflow-eos`` subcommands
(:meth:`TargetSpec.commands`, :func:`target_commands`) and its own tables in the
ledger (:meth:`TargetSpec.ledger_migrations`, applied by ``Ledger.migrate``).
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TextIO
from urllib.parse import quote

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.migrations import TargetMigration
from airflow_eos.core.registry import BUILTIN_KINDS, kind_class, registered_kinds

if TYPE_CHECKING:
    from airflow_eos.core.sink import Sink

# Before specs carried their kind, every target was a PostgreSQL table: a spec
# dict without "kind" (in a trigger or a job environment written then) is of
# this kind, and so is a bare name where a target is expected (verify's table
# name) and a pipeline claimed for no target (planned before claims).
LEGACY_KIND = "postgres"

# The connection types the hook layer knows how to resolve, and into what.
POSTGRES = "postgres"  # -> a libpq URL (the ledger always lives in a PostgreSQL database)
KAFKA = "kafka"  # -> a librdkafka configuration dict
# -> the connection's own fields, for a target that reads them itself (a catalog's
# properties): {"conn_type", "host", "port", "login", "password", "schema", "extra": {...}}
CONNECTION = "connection"
SPARK = "spark"  # the stage job's (spark-submit or Spark Connect); resolved by the Spark provider
# The connection each kind of connection argument defaults to, declared once.
DEFAULT_CONN_IDS = {POSTGRES: "postgres_default", KAFKA: "kafka_default", SPARK: "spark_default"}


@dataclass(frozen=True)
class ConnectionRef:
    """An Airflow connection a target needs, by the role it plays for the target."""

    role: str  # the key of its value in bind(): "ledger", "kafka", ...
    conn_type: str  # POSTGRES | KAFKA
    conn_id: str


@dataclass(frozen=True)
class TargetCommand:
    """An ``airflow-eos`` subcommand a target kind brings (its ``resolve``, ...).

    The CLI adds it with its PostgreSQL connection options (``--postgres-url``,
    ``--postgres-conn-id``) and its exit codes; ``run`` gets the ledger's URL
    those options resolve to, the parsed arguments and the output stream, and
    returns the exit code. A ConfigurationError it raises is a usage error
    (exit code 2, its message on one line)."""

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[str, argparse.Namespace, TextIO], int]


class TargetSpec(ABC):
    """What a DAG says about a target; immutable plain values.

    Subclasses are frozen dataclasses with a class attribute ``kind``.
    """

    kind: ClassVar[str]
    # The prefix of the kind's target_id ("postgresql" of postgresql:analytics.orders);
    # None: its specs cannot be built back from their identity (from_target_name).
    id_scheme: ClassVar[str | None] = None

    @classmethod
    def from_target_name(cls, name: str) -> "TargetSpec":
        """The unbound spec of the target whose :attr:`target_id` is
        ``<id_scheme>:<name>``, its connections the ones the identity names
        or the defaults: how the CLI turns a pipeline's claim back into its
        target. Only for a kind with an ``id_scheme``."""
        raise ConfigurationError(f"a {cls.kind!r} target cannot be built from its identity: give its spec")

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able values, with ``"kind"``. A bound spec includes
        its resolved values (for the stage job's environment, never a log);
        an unbound one names connections only and holds no secret."""

    @classmethod
    @abstractmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "TargetSpec":
        """The inverse of :meth:`to_dict` (without ``"kind"``)."""

    @abstractmethod
    def connections(self) -> tuple[ConnectionRef, ...]:
        """The Airflow connections still to resolve; empty once bound."""

    @abstractmethod
    def bind(self, values: Mapping[str, Any]) -> "TargetSpec":
        """The spec with each connection's value (``{role: value}``)."""

    @abstractmethod
    def sink(self) -> "Sink":
        """The runtime sink of a bound spec; ConfigurationError if unbound."""

    @property
    @abstractmethod
    def ledger_conn_id(self) -> str:
        """The ``postgres`` connection of the database holding the ledger."""

    @property
    @abstractmethod
    def target_id(self) -> str:
        """The target's identity for a pipeline's claim (``postgresql:schema.table``, ...)."""

    @property
    def target_aliases(self) -> tuple[str, ...]:
        """Other ids the same target may have been claimed under (an earlier
        version's spelling of it, e.g. a file target's unresolved path): a
        plan reads a claim recorded under one as a claim of :attr:`target_id`
        and records it so. None by default."""
        return ()

    @property
    def exclusive(self) -> bool:
        """True if the target takes the windows of one pipeline only."""
        return False

    @property
    @abstractmethod
    def asset_uri(self) -> str:
        """The URI of the Airflow Asset a commit of this target updates, in the
        form the provider of its scheme registers (``postgres://host:port/db/schema/table``,
        ``file:///root``, ``kafka://broker/topic``) so that it is the asset other
        tools name for the same data; no secret. Where the host comes from a
        connection, only a bound spec has one (ConfigurationError otherwise)."""

    @property
    @abstractmethod
    def label(self) -> str:
        """The target as a person names it in a message (a table, a path, a topic)."""

    @property
    def bound(self) -> bool:
        return not self.connections()

    def check_for_dag(self) -> None:
        """Refuse what must not appear in a DAG file (an inline secret): a DAG
        names connections. Nothing by default."""

    @classmethod
    def commands(cls) -> Sequence[TargetCommand]:
        """The kind's own ``airflow-eos`` subcommands; none by default."""
        return ()

    @classmethod
    def ledger_migrations(cls) -> Sequence[TargetMigration]:
        """The kind's own tables in the ledger, step by step; none by default."""
        return ()


# What a part of an asset URI keeps as it is: a path its RFC 3986 path characters
# but "%" (so an ASCII path of them names the asset it always named), a host its
# "host:port" and IPv6 brackets, a name inside a path (a table, a topic) nothing
# but letters, digits and "_.-~" (as these URIs always quoted them).
PATH, HOST, SEGMENT = "/:@!$&'()*+,;=", ":[]", ""


def uri_part(text: str, safe: str = SEGMENT) -> str:
    """``text`` percent-encoded (as UTF-8) for an asset URI, the one encoding
    every target's :attr:`TargetSpec.asset_uri` uses: ``%``, ``#``, ``?``,
    spaces and every non-ASCII character always, so that Airflow accepts the
    URI (it must be ASCII), no fragment or query cuts it short, and two
    different names never give one URI. ``safe``: PATH, HOST or SEGMENT."""
    return quote(text, safe=safe)


def kafka_asset_uri(kafka_config: Mapping[str, Any], topic: str) -> str:
    """``kafka://broker/topic``, the Kafka provider's asset URI of a topic: the
    first of ``bootstrap.servers`` (without a listener name such as ``SASL_SSL://``)."""
    servers = str(kafka_config.get("bootstrap.servers") or "")
    first = servers.split(",")[0].strip().rpartition("://")[2]
    if not first:
        raise ConfigurationError(f"no bootstrap.servers to name topic {topic!r} by: resolve the Kafka connection first")
    return f"kafka://{uri_part(first, HOST)}/{uri_part(topic)}"


def spec_class(kind: str) -> type[TargetSpec]:
    """The spec class of a registered kind (core/registry.py)."""
    return kind_class(kind)


def target_commands() -> list[TargetCommand]:
    """Every registered kind's own ``airflow-eos`` subcommands, by kind."""
    return [command for kind in registered_kinds() for command in spec_class(kind).commands()]


def with_kind(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data``, a spec dict, with its kind: one written before specs carried
    their kind is a :data:`LEGACY_KIND` spec's fields."""
    return data if "kind" in data else {"kind": LEGACY_KIND, **data}


def spec_of_target_id(target_id: str) -> TargetSpec | None:
    """The unbound spec a target identity names (``<scheme>:<name>``, as
    :attr:`TargetSpec.target_id` gives it and a pipeline's claim records it),
    built by the kind whose ``id_scheme`` the identity starts with; None when
    no registered kind builds specs of that scheme."""
    scheme, colon, name = target_id.partition(":")
    for kind in registered_kinds() if colon else ():
        cls = spec_class(kind)
        if cls.id_scheme is not None and cls.id_scheme == scheme:
            return cls.from_target_name(name)
    return None


def legacy_target(name: str) -> TargetSpec:
    """The unbound spec a bare name stands for where a target is expected:
    a :data:`LEGACY_KIND` target of that name (a table)."""
    return spec_class(LEGACY_KIND).from_target_name(name)


def target_from_dict(data: Mapping[str, Any]) -> TargetSpec:
    """The spec that :meth:`TargetSpec.to_dict` wrote."""
    if "kind" not in data:
        raise ConfigurationError(f"a target spec needs its 'kind' (one of {sorted(BUILTIN_KINDS)}), got keys "
                                 f"{sorted(data)}")
    fields = dict(data)
    return spec_class(fields.pop("kind")).from_fields(fields)


def as_spec(target: Any, what: str = "target") -> TargetSpec:
    """``target`` if it is a spec, else a clear error (for operator arguments)."""
    if isinstance(target, TargetSpec):
        return target
    if isinstance(target, Mapping) and "kind" in target:
        return target_from_dict(target)
    raise ConfigurationError(f"{what} must be a target spec such as PostgresTarget(table=..., postgres_conn_id=...), "
                             f"not {type(target).__name__}")
