"""Who a file target's root belongs to: its identity (the claim key in the
ledger) and its claim recorded in the root itself.

- **The identity** (``target_id``) is the real directory, ``files:`` and the
  path with every symlink resolved (``os.path.realpath``): the same directory
  named through a symlink or with ``..`` is one target, so the ledger's
  one-pipeline-per-root rule (core/ownership.py) sees it. Earlier versions
  keyed claims on the path as written (normalised, symlinks not resolved):
  that id is the target's alias (``target_aliases``), and a plan that finds
  its pipeline claimed under it records the claim under the real path.
- **The root claim** (``_eos_root.json`` in the root) is written by the first
  ``begin`` into the root and names the ledger (and, unless the layout holds
  ``{pipeline}``, the one pipeline) that publishes there. A ledger claim only
  sees the pipelines of its own database; the file in the root is seen by
  every pipeline of every ledger, so a second one is refused at its first
  ``begin``, whatever ledger it uses. Its name starts with ``_``: Spark,
  PyArrow, Hive and DuckDB never read it as data.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from airflow_eos.core.errors import TargetError

if TYPE_CHECKING:
    import psycopg

    from airflow_eos.targets.files.storage import Files

ROOT_CLAIM = "_eos_root.json"
ROOT_CLAIM_FORMAT = "airflow-eos/files-root/1"


def root_id(root: str) -> str:
    """``files:`` and the real directory (symlinks resolved); an hdfs:// root as it is (normalised by the spec)."""
    if "://" in root:
        return "files:" + root
    return "files:" + os.path.realpath(root)


def root_aliases(root: str) -> tuple[str, ...]:
    """The id earlier versions gave the same root (the path as written), if
    it differs from :func:`root_id`."""
    legacy = "files:" + root
    return () if legacy == root_id(root) else (legacy,)


@dataclass(frozen=True)
class RootClaim:
    """What ``_eos_root.json`` records."""

    ledger: str  # the ledger's identity: when its schema was created (eos.schema_version), UTC
    ledger_at: str  # where it was, for people: server address:port/database (no user, no password)
    pipeline: str | None  # the one pipeline publishing here; None: the ledger's pipelines ({pipeline} layout)
    layout: str
    claimed_at: str = ""
    format: str = ROOT_CLAIM_FORMAT

    def describe(self) -> str:
        who = f"pipeline {self.pipeline!r}" if self.pipeline else "the pipelines"
        return f"{who} of the ledger in {self.ledger_at} (created {self.ledger})"


def ledger_identity(conn: psycopg.Connection) -> tuple[str, str]:
    """(identity, location) of the ledger ``conn`` is connected to: the time
    its schema was created (kept by a dump and restore, distinct between
    ledgers), and its server and database (no credentials)."""
    created, db, addr, port = conn.execute(
        "SELECT (SELECT min(applied_at) FROM eos.schema_version), current_database(), inet_server_addr()::text,"
        " inet_server_port()").fetchone()
    where = f"{(addr or 'local socket').split('/')[0]}:{port or ''}/{db}"
    return created.astimezone(timezone.utc).isoformat(), where


def read_root_claim(files: Files, root: str) -> RootClaim | None:
    """The root's claim, or None if it has none; TargetError if unreadable."""
    path = os.path.join(root, ROOT_CLAIM)
    try:
        doc = json.loads(files.read_bytes(path))
        if doc.get("format") != ROOT_CLAIM_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, not {ROOT_CLAIM_FORMAT!r}")
        return RootClaim(**{k: doc.get(k) for k in RootClaim.__dataclass_fields__ if k in doc})
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise TargetError(f"{path} (the claim of the file target's root) is unreadable ({exc}): restore it, or "
                          "delete it if no other pipeline publishes into this root") from None


def claim_root(files: Files, root: str, wanted: RootClaim) -> RootClaim:
    """Record ``wanted`` as the root's claim if it has none (atomically: of
    two pipelines claiming at once, one wins), or check that the recorded
    one admits it; TargetError, saying who holds the root, otherwise."""
    claim = read_root_claim(files, root)
    if claim is None:
        claim = _create(files, root, wanted) or read_root_claim(files, root)
    problem = _conflict(claim, wanted)
    if problem:
        path = os.path.join(root, ROOT_CLAIM)
        raise TargetError(
            f"cannot publish {wanted.describe()} into {root}: {problem} ({path}, claimed {claim.claimed_at}). Two "
            "pipelines publishing into one directory would mix their windows for every reader of it. Give this "
            f"pipeline a root of its own; if {claim.describe()} no longer publishes here, delete {path} (the root "
            "is then claimed again by the next pipeline that begins a window in it)")
    return claim


def _conflict(claim: RootClaim, wanted: RootClaim) -> str | None:
    if claim.ledger != wanted.ledger:
        return f"the root belongs to {claim.describe()}, another ledger"
    if claim.pipeline is not None and claim.pipeline != wanted.pipeline:
        return f"the root belongs to {claim.describe()}"
    if claim.pipeline is None and wanted.pipeline is not None:
        return (f"the root is shared by {claim.describe()} with the layout {claim.layout!r}, and this pipeline's "
                f"layout {wanted.layout!r} has no {{pipeline}}")
    return None


def _create(files: Files, root: str, wanted: RootClaim) -> RootClaim | None:
    """Write the claim unless one exists (never replacing one); None if
    another was there first."""
    claim = RootClaim(wanted.ledger, wanted.ledger_at, wanted.pipeline, wanted.layout,
                      datetime.now(timezone.utc).isoformat())
    try:
        files.create_exclusive(os.path.join(root, ROOT_CLAIM),
                               (json.dumps(asdict(claim), indent=1, sort_keys=True) + "\n").encode())
    except FileExistsError:
        return None
    return claim
