"""How the CLI prints: tables (tabulate, which Airflow's own CLI uses) for
people, JSON (``-o json``, stable keys documented in docs/cli.md) for scripts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

from tabulate import tabulate

TABLE, JSON = "table", "json"


def output_option() -> argparse.ArgumentParser:
    """``-o/--output table|json`` (a parent parser)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-o", "--output", choices=(TABLE, JSON), default=TABLE,
                        help="table (for people, the default) or json (one object, stable keys, for scripts and "
                             "monitoring: see docs/cli.md)")
    return parser


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned plain text: numbers to the right, everything else to the left;
    None prints as '-', a datetime as UTC seconds."""
    cells = [[when(v) if isinstance(v, datetime) else v for v in row] for row in rows]
    return tabulate(cells, headers=list(headers), tablefmt="simple", numalign="right", stralign="left",
                    missingval="-")


def when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def iso(value: datetime | None) -> str | None:
    """A timestamp in JSON output: ISO 8601 in UTC, or null."""
    return None if value is None else value.astimezone(timezone.utc).isoformat()


def print_json(document: dict[str, Any], out: TextIO) -> None:
    json.dump(document, out, indent=2, sort_keys=False)
    out.write("\n")
