"""Where a window's partition directory lives under a FileTarget's root.

Plain string work, cheap to import (a DAG file checks its layout at parse time).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from datetime import datetime, timedelta

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.windows import to_utc

DEFAULT_LAYOUT = "eos_window_start={window_start}"
# How long a replaced window's old version is kept in the trash before it is
# deleted: readers that listed the partition just before the replace go on
# reading it (Spark's file sink waits as long, 10 min, before deleting its
# compacted log files: spark.sql.streaming.fileSink.log.cleanupDelay).
DEFAULT_REPLACED_RETENTION = timedelta(minutes=10)
LAYOUT_FIELDS = ("window_start", "window_end", "pipeline")

# Spark's escaping of a partition value in a path (ExternalCatalogUtils.escapePathName),
# which Spark's and PyArrow's Hive partition discovery undo. ":" above all: a
# Hadoop Path cannot hold it (it would read as a URI scheme).
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(0x20)}


def escape_path_value(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def window_value(instant: datetime) -> str:
    """A window boundary as it appears in a partition path: UTC ISO 8601 with
    ``Z``, escaped as Spark escapes partition values (``2026-01-01T00%3A00%3A00Z``)."""
    return escape_path_value(to_utc(instant).strftime("%Y-%m-%dT%H:%M:%SZ"))


@dataclass(frozen=True)
class Layout:
    """Where a window's partition lives under the root: a relative path with
    placeholders ``{window_start}`` (required: it tells windows apart),
    ``{window_end}`` and ``{pipeline}``, each escaped as Spark escapes a
    partition value. Hive style (``key=value`` segments) lets Spark, PyArrow and
    DuckDB read the window back as a column."""

    template: str = DEFAULT_LAYOUT

    def __post_init__(self) -> None:
        t = self.template
        if not isinstance(t, str) or not t.strip():
            raise ConfigurationError(f"layout must be a relative path with {{window_start}}, like {DEFAULT_LAYOUT!r}")
        try:
            fields = [f for _, f, spec, conv in string.Formatter().parse(t) if f is not None]
            specs = [(spec, conv) for _, f, spec, conv in string.Formatter().parse(t) if f is not None]
        except ValueError as exc:
            raise ConfigurationError(f"layout {t!r} is not a valid template: {exc}") from exc
        unknown = sorted({f for f in fields if f not in LAYOUT_FIELDS})
        if unknown:
            raise ConfigurationError(f"layout {t!r} names {unknown}; it may name {list(LAYOUT_FIELDS)}")
        if any(spec or conv for spec, conv in specs):
            raise ConfigurationError(f"layout {t!r}: placeholders take no format spec or conversion")
        if "window_start" not in fields:
            raise ConfigurationError(f"layout {t!r} must contain {{window_start}}: it is what tells two windows "
                                     "of a pipeline apart")
        if t.startswith("/") or t.endswith("/") or "//" in t:
            raise ConfigurationError(f"layout {t!r} must be a relative path without empty segments")
        for segment in t.split("/"):
            if segment in (".", ".."):
                raise ConfigurationError(f"layout {t!r} may not contain '.' or '..'")
            if segment[:1] in ("_", "."):
                raise ConfigurationError(
                    f"layout {t!r}: segment {segment!r} starts with {segment[0]!r}, and readers (Spark, Hive, "
                    "PyArrow) skip such directories: the published windows would be invisible")

    @property
    def keys(self) -> tuple[str, ...]:
        """The column names the layout's Hive segments give readers (``key=...``)."""
        return tuple(s.partition("=")[0] for s in self.template.split("/") if "=" in s)

    def render(self, pipeline: str, window_start: datetime, window_end: datetime) -> str:
        """The window's partition directory, relative to the root. A segment
        that would start with "." or "_" (a pipeline named so) has that
        character escaped: readers would skip it."""
        path = self.template.format(window_start=window_value(window_start), window_end=window_value(window_end),
                                    pipeline=escape_path_value(pipeline))
        return "/".join(f"%{ord(s[0]):02X}{s[1:]}" if s[:1] in ("_", ".") else s for s in path.split("/"))
