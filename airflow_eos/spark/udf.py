"""Helpers for transform authors whose per-record code may fail: an exception
raised for one record makes it a dead letter (its ``eos_error``), not a failed
Spark task. See :mod:`airflow_eos.spark.stage` for what a transform returns.

No pyspark import at module level: a transform's module imports these while a
DAG file names it; the UDF is built when the transform runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from airflow_eos.core.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

ERROR_COLUMN = "eos_error"
MAX_ERROR_CHARS = 2_000



def describe_error(exc: BaseException) -> str:
    """An exception as a dead letter's error text: its type and message, bounded."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def catch_errors(fn: Callable) -> Callable:
    """Wrap a per-record function so that it returns ``(result, None)``, or
    ``(None, error)`` when it raises, instead of failing the Spark task. Use the
    error as the row's ``eos_error``; :func:`safe_udf` does that for a UDF."""

    @functools.wraps(fn)
    def caught(*args, **kwargs):
        try:
            return fn(*args, **kwargs), None
        except Exception as exc:  # noqa: BLE001 - any failure of one record makes it a dead letter
            return None, describe_error(exc)

    return caught


def safe_udf(returnType: "DataType | str") -> Callable[[Callable], Callable[..., "Column"]]:
    """Decorator: a Python UDF whose exceptions become dead letters.

    The UDF returns a struct: the fields of ``returnType`` (a struct type, the
    function returning a dict, tuple or Row), or for any other type one field
    ``value``, plus the field ``eos_error`` (null unless the function raised, or
    returned a struct of the wrong shape). Select ``"alias.*"`` to get the fields
    and ``eos_error`` as columns; see :mod:`airflow_eos.spark.stage` for an example.
    """

    def decorate(fn: Callable) -> Callable[..., "Column"]:
        def build():
            # Built at each call, not at decoration: parsing a DDL string needs a
            # session, which exists once a transform calls the UDF (not always when
            # its module is imported), and a UDF object keeps the JVM it was first
            # used in, which a later session may have replaced.
            from pyspark.sql import functions as F
            from pyspark.sql.types import DataType, StringType, StructField, StructType

            rtype = returnType if isinstance(returnType, DataType) else DataType.fromDDL(returnType)
            error_field = StructField(ERROR_COLUMN, StringType())
            if isinstance(rtype, StructType):
                names = tuple(rtype.names)
                if ERROR_COLUMN in names:
                    raise ConfigurationError(f"safe_udf {fn.__name__}: {ERROR_COLUMN!r} is added by safe_udf")
                out_type = StructType([*rtype.fields, error_field])
                nulls = (None,) * len(names)

                def row(*args):
                    try:
                        result = fn(*args)
                        if result is None:
                            return (*nulls, None)
                        if isinstance(result, Mapping):
                            values = tuple(result[n] for n in names)
                        else:
                            values = tuple(result)
                            if len(values) != len(names):
                                raise ValueError(f"returned {len(values)} values for the {len(names)} fields {names}")
                        return (*values, None)
                    except Exception as exc:  # noqa: BLE001 - see catch_errors
                        return (*nulls, describe_error(exc))
            else:
                out_type = StructType([StructField("value", rtype), error_field])
                caught = catch_errors(fn)

                def row(*args):
                    return caught(*args)

            return F.udf(row, out_type)

        @functools.wraps(fn)
        def column(*cols) -> "Column":
            return build()(*cols)

        return column

    return decorate


__all__ = ["ERROR_COLUMN", "MAX_ERROR_CHARS", "catch_errors", "describe_error", "safe_udf"]
