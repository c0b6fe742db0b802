"""The names the PostgreSQL target reads and gives: the one parser of
``schema.table`` in the package, its modes and the constraint and trigger it
gives a staging. (The staging's own names are the shared staging's,
:mod:`airflow_eos.staging.tables`; the columns every target reserves are the
core's, :mod:`airflow_eos.core.columns`.)

psycopg is imported by the functions that need it: a DAG file builds a
PostgresTarget (which parses its table name) at parse time.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from airflow_eos.core.errors import ConfigurationError

if TYPE_CHECKING:
    from psycopg import sql

PARTITION_PER_WINDOW = "partition_per_window"
MODES = ("replace_window", "upsert", PARTITION_PER_WINDOW)
BOUND_CONSTRAINT = "eos_window_bound"  # partition_per_window: the staging's CHECK that matches the partition bound
SEALED_TRIGGER = "eos_sealed"  # partition_per_window: a sealed staging refuses changes (migration 4)
ON_COMMITTED = ("skip", "replace")
ID_SCHEME = "postgresql"  # a target id's scheme: postgresql:schema.table


def parse_table_name(name: str) -> tuple[str | None, str]:
    """``table``, ``schema.table``, with any part double-quoted (``""`` escapes a
    quote) as in SQL; unquoted parts fold to lower case as PostgreSQL does. The
    parts are only ever used through ``sql.Identifier``."""
    parts: list[str] = []
    i, n = 0, len(name)
    while True:
        if i < n and name[i] == '"':
            chars, j = [], i + 1
            while True:
                k = name.find('"', j)
                if k < 0:
                    raise ConfigurationError(f"table name {name!r} has an unterminated quoted identifier")
                chars.append(name[j:k])
                if name.startswith('"', k + 1):
                    chars.append('"')
                    j = k + 2
                    continue
                break
            part, i = "".join(chars), k + 1
        else:
            k = name.find(".", i)
            k = n if k < 0 else k
            part = name[i:k].strip()
            if '"' in part:
                raise ConfigurationError(f"table name {name!r}: quote only whole parts, like \"my schema\".table")
            part, i = part.lower(), k
        if not part:
            raise ConfigurationError(f"table name {name!r} has an empty part")
        parts.append(part)
        if i == n:
            break
        if name[i] != ".":
            raise ConfigurationError(f"table name {name!r}: unexpected {name[i:]!r} after a quoted part")
        i += 1
    if len(parts) > 2:
        raise ConfigurationError(f"table name {name!r} has {len(parts)} parts; give table or schema.table")
    return (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])


def table_identifier(name: str) -> sql.Identifier:
    """The table ``name`` (see parse_table_name) as an SQL identifier."""
    from psycopg import sql
    schema, table = parse_table_name(name)
    return sql.Identifier(table) if schema is None else sql.Identifier(schema, table)


def table_target_id(name: str) -> str:
    """The table ``name``'s identity for the pipeline's claim in the ledger:
    ``postgresql:schema.table``, normalised so that ``analytics.orders`` and
    ``"analytics".ORDERS`` are one target. A part is double-quoted only where
    PostgreSQL would need it (``postgresql:"My Schema".orders``). A name
    without a schema is taken to be in ``public``, where PostgreSQL's default
    search_path puts it. The database needs no naming: the ledger lives in it."""
    schema, table = parse_table_name(name)
    return f"{ID_SCHEME}:" + ".".join(quoted_if_needed(part) for part in (schema or "public", table))


def quoted_if_needed(part: str) -> str:
    """A name part as PostgreSQL prints identifiers: bare when it reads back as
    itself unquoted, else double-quoted with quotes doubled."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", part):
        return part
    return '"' + part.replace('"', '""') + '"'

