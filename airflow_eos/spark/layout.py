"""What the staging writer receives: the transform's output shaped into the
staged columns (the target's, in the staging's order) and the columns that make
a row a dead letter and describe it (Layout, writer_input), or the records as
read when there is no transform (records_as_read). See
:mod:`airflow_eos.spark.stage` for the transform's contract.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.spark.udf import ERROR_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

RAW_COLUMNS = ("key", "value")  # the raw record kept with a dead letter

# Columns the job adds to the writer's input beside the staged ones; the prefix
# keeps them apart from any target column.
_ERROR = "__eos_error"
_LINEAGE = ("__eos_topic", "__eos_partition", "__eos_offset")
_RAW = ("__eos_key", "__eos_value")


@dataclass(frozen=True)
class Layout:
    """The columns of the writer's input: the staged ones (the target's, in the
    staging's order) and those that make a row a dead letter and describe it."""

    staged: tuple[str, ...]
    error: str | None = None  # null: stage the row; else a dead letter with this error
    lineage: tuple[str, str, str] | None = None  # the source record of each row
    raw: tuple[str, str] | None = None  # a dead letter's raw key and value (null for good rows)
    types: tuple[str, ...] | None = None  # the transform's type of each staged column (Spark's name), for messages

    @property
    def kept(self) -> tuple[str, ...]:
        """What a write task keeps of a good row: the staged columns, and lineage
        kept apart from them (to dead-letter a row the target refuses)."""
        extra = tuple(c for c in (self.lineage or ()) if c not in self.staged)
        return self.staged + extra

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        data = json.loads(text)
        return cls(tuple(data["staged"]), data["error"], tuple(data["lineage"]) if data["lineage"] else None,
                   tuple(data["raw"]) if data["raw"] else None,
                   tuple(data["types"]) if data.get("types") else None)


def _col(name: str) -> "Column":
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _find(columns: Sequence[str], name: str) -> str | None:
    """The column called ``name``: exactly, else the one case-insensitive match
    (PostgreSQL folds unquoted names to lower case, Spark keeps ``timestampType``)."""
    if name in columns:
        return name
    matches = [c for c in columns if c.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


def records_as_read(df: "DataFrame") -> "DataFrame":
    """The window's records with lineage: what is staged without a transform."""
    from pyspark.sql import functions as F

    return df.select(
        "*",
        F.col("topic").alias("eos_topic"),
        F.col("partition").alias("eos_partition"),
        F.col("offset").alias("eos_offset"),
    ).withColumn("headers", F.to_json("headers"))


def writer_input(out: "DataFrame", staged: Sequence[str], not_null: Iterable[str], *, table: str,
                 strict: bool = True) -> tuple["DataFrame", Layout]:
    """Shape a transform's output for the staging writer (the contract is in
    :mod:`airflow_eos.spark.stage`); refuse, before any work, an output that cannot be staged."""
    from pyspark.sql import functions as F

    found, error, lineage, raw = _output_columns(out, staged, table=table, strict=strict)
    checks = [F.when(_col(found[c]).isNull(), F.lit(f"null in column {c}, which is NOT NULL in {table}"))
              for c in staged if c in set(not_null)]
    reasons = ([_col(error)] if error is not None else []) + checks
    columns = [_col(found[c]).alias(c) for c in staged]
    types = tuple(out.schema[found[c]].dataType.simpleString() for c in staged)
    layout_lineage = None
    if all(c in staged for c in LINEAGE_COLUMNS):
        layout_lineage = tuple(LINEAGE_COLUMNS)
    elif all(lineage):
        layout_lineage = _LINEAGE
        columns += [_col(lineage[0]).cast("string").alias(_LINEAGE[0]), _col(lineage[1]).cast("int").alias(_LINEAGE[1]),
                    _col(lineage[2]).cast("long").alias(_LINEAGE[2])]
    if not reasons:
        return out.select(*columns), Layout(tuple(staged), None, layout_lineage, None, types)
    # The error first, in a projection of its own, so the rest refers to it
    # rather than repeating it (a UDF's result, for instance).
    with_error = out.withColumn(_ERROR, F.coalesce(*reasons) if len(reasons) > 1 else reasons[0])
    columns.append(F.col(_ERROR))
    layout_raw = None
    if all(raw):
        layout_raw = _RAW
        columns += _raw_record_columns(out, raw)
    return with_error.select(*columns), Layout(tuple(staged), _ERROR, layout_lineage, layout_raw, types)


def _output_columns(out: "DataFrame", staged: Sequence[str], *, table: str,
                    strict: bool) -> tuple[dict[str, str], str | None, list[str | None], list[str | None]]:
    """The output's names for the staged columns, the error column and the
    lineage and raw record columns (None where it has none); raises
    ConfigurationError for an output that cannot be staged: a staged column
    missing, a column nobody stages (``strict``), an error that is not a string
    or comes without the lineage of its record."""
    from pyspark.sql.types import StringType

    names = list(out.columns)
    found = {c: _find(names, c) for c in staged}
    missing = [c for c, f in found.items() if f is None]
    if missing:
        raise ConfigurationError(f"the transform's output lacks columns {missing} of target {table} "
                                 f"(it has {names}); target columns to stage: {list(staged)}. Make the "
                                 "transform return them, or change the target; nothing was staged")
    error = _find(names, ERROR_COLUMN)
    lineage = [_find(names, c) for c in LINEAGE_COLUMNS]
    raw = [_find(names, c) for c in RAW_COLUMNS]
    if strict:
        known = {*found.values(), error, *lineage, *raw} - {None}
        extra = [n for n in names if n not in known]
        if extra:
            raise ConfigurationError(
                f"the transform's output has columns {extra} that target {table} does not stage; "
                f"drop them (target columns: {list(staged)}; also allowed: {ERROR_COLUMN}, "
                f"{', '.join(LINEAGE_COLUMNS)}, {', '.join(RAW_COLUMNS)})")
    if error is not None and not isinstance(out.schema[error].dataType, StringType):
        raise ConfigurationError(f"column {error!r} must be a string (the dead letter's error), "
                                 f"not {out.schema[error].dataType.simpleString()}")
    if error is not None and not all(lineage):
        raise ConfigurationError(
            f"the transform's output has {ERROR_COLUMN} but not the lineage columns {list(LINEAGE_COLUMNS)}: "
            "a dead letter must name its source record")
    return found, error, lineage, raw


def _raw_record_columns(out: "DataFrame", raw: Sequence[str]) -> list["Column"]:
    """A dead letter's raw key and value as binary columns (``_RAW``); good
    rows carry nulls, which cost nothing."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    columns = []
    for name, alias in zip(raw, _RAW, strict=True):
        kind = out.schema[name].dataType
        value = (_col(name) if isinstance(kind, BinaryType) else
                 _col(name).cast("binary") if isinstance(kind, StringType) else
                 _col(name).cast("string").cast("binary"))
        columns.append(F.when(F.col(_ERROR).isNotNull(), value).alias(alias))
    return columns


__all__ = ["RAW_COLUMNS", "Layout", "records_as_read", "writer_input"]
