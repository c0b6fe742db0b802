"""PostgresTarget: what a DAG names of a PostgreSQL table as a
two-phase-commit target, the serialisable spec (core/target.py): plain values,
cheap to import (no psycopg). Bound to its database URL (by the hook, from
``postgres_conn_id``, or given ``url`` outside Airflow), it builds its runtime
part, :class:`~airflow_eos.targets.postgres.sink.PostgresSink` (whose docstring
tells a window's life through it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eos.core.database import redact
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.target import DEFAULT_CONN_IDS, POSTGRES, ConnectionRef, TargetSpec, uri_part
from airflow_eos.core.columns import DEAD_LETTER_COLUMNS, LINEAGE_COLUMNS, WINDOW_COLUMNS
from airflow_eos.staging.encoding import _csv
from airflow_eos.staging.tables import CHUNK_COLUMN, DEAD_LETTER_SUFFIX, STAGING_SCHEMA
from airflow_eos.staging.writer import StagingWriter
from airflow_eos.targets.postgres.names import (
    BOUND_CONSTRAINT,
    ID_SCHEME,
    MODES,
    ON_COMMITTED,
    PARTITION_PER_WINDOW,
    SEALED_TRIGGER,
    parse_table_name,
    table_target_id,
)

if TYPE_CHECKING:
    from airflow_eos.targets.postgres.sink import PostgresSink

# Importable from here as before the package was split (other modules, tests, bench).
__all__ = [
    "PostgresTarget", "StagingWriter", "parse_table_name", "_csv", "STAGING_SCHEMA", "WINDOW_COLUMNS",
    "LINEAGE_COLUMNS", "CHUNK_COLUMN", "DEAD_LETTER_SUFFIX", "DEAD_LETTER_COLUMNS", "PARTITION_PER_WINDOW", "MODES",
    "BOUND_CONSTRAINT", "SEALED_TRIGGER", "ON_COMMITTED",
]


@dataclass(frozen=True)
class PostgresTarget(TargetSpec):
    """A PostgreSQL table as a two-phase-commit target (see
    :mod:`airflow_eos.targets.postgres.sink`): each window is published in one
    transaction with the pipeline's offsets.

    - ``url``: the target database, which also holds the ledger (schema
      ``eos``), outside Airflow (tests, scripts); a DAG names the connection
      instead (``postgres_conn_id``), which the operators resolve (``bind``).
    - ``table``: ``table`` or ``schema.table`` (see parse_table_name). It must
      exist; the sink never creates or alters it.
    - ``mode``: ``replace_window`` (rows carry the window in ``eos_pipeline`` and
      ``eos_window_start``, which the commit fills) or ``upsert`` (``INSERT … ON
      CONFLICT (key) DO UPDATE``; ``key`` needs a unique index; the window
      columns are filled if the table has them) or ``partition_per_window``
      (the table is ``PARTITION BY RANGE (eos_window_start)`` and each window's
      staging is attached as its partition: no rows are copied at commit, see
      :mod:`airflow_eos.targets.postgres.sink`; unique indexes must include eos_window_start, as
      PostgreSQL requires of a partitioned table).
    - ``on_committed``: what committing a window that is already committed does:
      ``skip`` (nothing; reported) or ``replace`` (the window's published rows are
      replaced by this attempt's, atomically; in upsert mode the rows are
      upserted again, and rows still tagged with this window are deleted first;
      in partition_per_window mode the window's partition is dropped first).
    - ``columns``: the columns the job writes; default every column except the
      window columns and generated ones. Name them when the table has columns
      the job leaves to their defaults.
    - ``postgres_conn_id``: the Airflow connection of the target database.
    """

    url: str | None = None
    table: str = ""
    mode: str = "replace_window"
    key: tuple[str, ...] = ()
    on_committed: str = "skip"
    columns: tuple[str, ...] | None = None
    postgres_conn_id: str = DEFAULT_CONN_IDS[POSTGRES]

    kind: ClassVar[str] = "postgres"
    id_scheme: ClassVar[str] = ID_SCHEME

    @classmethod
    def from_target_name(cls, name: str) -> "PostgresTarget":
        """The table ``name`` (``schema.table`` as :attr:`target_id` writes it)."""
        return cls(table=name)

    def __post_init__(self) -> None:
        if not self.table or not isinstance(self.table, str):
            raise ConfigurationError("PostgresTarget needs table='table' or table='schema.table'")
        if self.mode not in MODES:
            raise ConfigurationError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.on_committed not in ON_COMMITTED:
            raise ConfigurationError(f"on_committed must be one of {ON_COMMITTED}, not {self.on_committed!r}")
        if isinstance(self.key, str):
            object.__setattr__(self, "key", (self.key,))
        object.__setattr__(self, "key", tuple(self.key))
        if self.mode == "upsert" and not self.key:
            raise ConfigurationError("mode 'upsert' needs key columns")
        if self.mode != "upsert" and self.key:
            raise ConfigurationError("key columns are only used in mode 'upsert'")
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
            bad = [c for c in self.columns if c in WINDOW_COLUMNS or c == CHUNK_COLUMN]
            if bad:
                raise ConfigurationError(f"columns {bad} are filled by the sink, not written by the job")
        parse_table_name(self.table)  # fail at DAG parse time, not at commit

    def __repr__(self) -> str:
        where = redact(self.url) if self.url else f"connection {self.postgres_conn_id!r}"
        return f"PostgresTarget({self.table!r} in {where}, mode={self.mode!r}, on_committed={self.on_committed!r})"

    def with_url(self, url: str) -> "PostgresTarget":
        return dataclasses.replace(self, url=url)

    def _url(self) -> str:
        if not self.url:
            raise ConfigurationError(f"{self!r} has no database URL: resolve postgres_conn_id with with_url()")
        return self.url

    # ------------------------------------------------------------------ the spec (core/target.py)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "table": self.table, "mode": self.mode, "key": list(self.key),
                "on_committed": self.on_committed,
                "columns": list(self.columns) if self.columns is not None else None,
                "postgres_conn_id": self.postgres_conn_id}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "PostgresTarget":
        fields = dict(fields)
        fields["key"] = tuple(fields.get("key") or ())
        if fields.get("columns") is not None:
            fields["columns"] = tuple(fields["columns"])
        return cls(**fields)

    def connections(self) -> tuple[ConnectionRef, ...]:
        return () if self.url else (ConnectionRef("ledger", POSTGRES, self.postgres_conn_id),)

    def bind(self, values: Mapping[str, Any]) -> "PostgresTarget":
        return self if self.url else self.with_url(values["ledger"])

    def sink(self) -> "PostgresSink":
        from airflow_eos.targets.postgres.sink import PostgresSink
        return PostgresSink(url=self._url(), table=self.table, mode=self.mode, key=self.key,
                            on_committed=self.on_committed, columns=self.columns, spec=self)

    @property
    def ledger_conn_id(self) -> str:
        return self.postgres_conn_id

    @property
    def target_id(self) -> str:
        """``postgresql:schema.table``, normalised (see :func:`~airflow_eos.targets.postgres.names.table_target_id`)."""
        return table_target_id(self.table)

    @property
    def label(self) -> str:
        return self.table

    @property
    def asset_uri(self) -> str:
        """``postgres://host:port/database/schema/table`` (the Postgres provider's
        form; schema ``public`` when the table names none), from the bound URL
        without its user or password."""
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(self._url())
        host = str(params.get("host") or "localhost").split(",")[0]
        port = str(params.get("port") or "5432").split(",")[0]
        database = params.get("dbname") or params.get("user") or "postgres"
        schema, table = parse_table_name(self.table)
        path = "/".join(uri_part(str(part)) for part in (database, schema or "public", table))
        return f"postgres://{uri_part(host)}:{uri_part(port)}/{path}"

    def check_for_dag(self) -> None:
        if self.url:
            raise ConfigurationError("in a DAG, name the target database with postgres_conn_id, not a URL: "
                                     "a URL would put its password into the DAG and the task logs")

    @property
    def exclusive(self) -> bool:
        """The table takes the windows of one pipeline only: in
        partition_per_window each window is one of its partitions, and another
        pipeline's windows would overlap them."""
        return self.mode == PARTITION_PER_WINDOW
