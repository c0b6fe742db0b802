"""The catalog, the table and what the table's snapshots say of our commits.

A window's commit is one snapshot whose summary carries the pipeline, the
window, the epoch and a commit token (:func:`commit_token`). Whether a
decided window reached the table is read back from the table alone
(:func:`find_commit`): as Iceberg's Flink committer finds its checkpoint id,
by walking the current snapshot's ancestry for the token, back to the snapshot
that was current when the window's publication began (its intent, in the
ledger); but where the ancestry is cut short before it (the user expired
snapshots), by the window's data files in the current snapshot, which expiry
never removes from it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_eos.core.errors import ConfigurationError, TargetError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

CATALOG_SCHEMA = "eos_iceberg"  # where the SQL catalog in the ledger's database keeps its two tables
# The summary keys of a window's snapshot.
PIPELINE, WINDOW_START, WINDOW_END, EPOCH, TOKEN = ("eos.pipeline", "eos.window-start", "eos.window-end",
                                                     "eos.epoch", "eos.commit-token")

_catalogs: dict[tuple[str, str], Catalog] = {}
_lock = threading.Lock()


def catalog_properties_of(connection: Mapping[str, Any]) -> dict[str, Any]:
    """A catalog connection's pyiceberg properties: its extras, the host as
    ``uri`` (unless the extras give one), the login and password as
    ``credential`` (``login:password``, OAuth2 client credentials) or the
    password alone as ``token`` (extras ``{"auth": "token"}``). Extras of
    type ``sql`` without a ``uri`` (nor a host) are the SQL catalog in the
    ledger's database with these properties (an object store's ``s3.*``)."""
    extra = dict(connection.get("extra") or {})
    props = {k: v for k, v in extra.items() if k != "auth"}
    host = connection.get("host")
    if "uri" not in props and host:
        scheme = "" if "://" in host else "http://"
        port = f":{connection['port']}" if connection.get("port") else ""
        props["uri"] = f"{scheme}{host}{port}"
    password = connection.get("password")
    if password and extra.get("auth") == "token":
        props.setdefault("token", password)
    elif password:
        props.setdefault("credential", f"{connection.get('login') or ''}:{password}")
    props.setdefault("type", "rest")
    return props


def ledger_catalog_properties(ledger_url: str) -> dict[str, Any]:
    """pyiceberg's SQL catalog in the ledger's PostgreSQL database (its tables
    in :data:`CATALOG_SCHEMA`, created by this target's ledger migration)."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    params = {k: str(v) for k, v in conninfo_to_dict(ledger_url).items()}
    query = {k: v for k, v in params.items() if k not in ("host", "port", "user", "password", "dbname")}
    query["options"] = f"-csearch_path={CATALOG_SCHEMA}"
    url = URL.create("postgresql+psycopg", username=params.get("user"), password=params.get("password"),
                     host=params.get("host"), port=int(params["port"]) if params.get("port") else None,
                     database=params.get("dbname"), query=query)
    return {"type": "sql", "uri": url.render_as_string(hide_password=False), "init_catalog_tables": "false",
            "pool_pre_ping": "true"}


def load_catalog(name: str, properties: Mapping[str, Any]) -> Catalog:
    """The catalog of these properties, one per process (its SQLAlchemy
    engine or its REST session is reused)."""
    from pyiceberg.catalog import load_catalog as pyiceberg_catalog

    key = (name, json.dumps(dict(properties), sort_keys=True))
    with _lock:
        if key not in _catalogs:
            _catalogs[key] = pyiceberg_catalog(name, **{k: str(v) for k, v in properties.items()})
        return _catalogs[key]


def load_table(catalog: Catalog, name: str, label: str) -> Table:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        raise TargetError(f"{label} does not exist: create it first (its schema is what the transform's output must "
                          "fit, lineage columns eos_topic, eos_partition, eos_offset included), e.g. with pyiceberg's "
                          "catalog.create_table or Spark's CREATE TABLE; see docs/iceberg-target.md") from None
    except Exception as exc:
        if isinstance(exc, (TargetError, ConfigurationError)):
            raise
        raise TargetError(f"cannot load {label} from its catalog: {type(exc).__name__}: {exc}") from exc


def commit_token(staging: str, decided_at: datetime) -> str:
    """The token of a decided window's snapshot: its attempt's staging name
    (pipeline, window, epoch) and the decision's time in microseconds, so
    that a ledger made again from nothing never takes an old snapshot for
    its own decision."""
    return f"{staging}-{int(decided_at.timestamp() * 1_000_000):x}"


def summary_properties(pipeline: str, window_start: datetime, window_end: datetime, epoch: int,
                       token: str) -> dict[str, str]:
    return {PIPELINE: pipeline, WINDOW_START: window_start.isoformat(), WINDOW_END: window_end.isoformat(),
            EPOCH: str(epoch), TOKEN: token}


@dataclass(frozen=True)
class Found:
    """Where :func:`find_commit` found a window's commit."""

    how: str  # "snapshot" (its token in the ancestry) or "files" (its data files in the current snapshot)
    snapshot_id: int | None


def find_commit(table: Table, token: str, base: int | None, paths: Iterable[str]) -> Found | None:
    """The window's commit in the table, or None if it is not there.

    The current snapshot's ancestry is walked back to ``base``, the table's
    snapshot when the window's publication began (its intent): our commit,
    made after it, is one of the snapshots seen. If the ancestry ends before
    ``base`` (expired since; or no base: the table was empty), the window's
    ``paths`` are looked for among the current snapshot's data files
    instead: an expired snapshot's files stay in every later snapshot until a
    delete or a replace removes them."""
    found, whole = in_history(table, token, base)
    if found is not None or whole:
        return found
    log.info("the history of %s back to snapshot %s is gone: looking for the window's files in its current snapshot",
             table.name(), base)
    return Found("files", None) if live_data_files(table, paths) else None


def in_history(table: Table, token: str, base: int | None) -> tuple[Found | None, bool]:
    """(the snapshot of the token in the current snapshot's ancestry back to
    ``base``, or None; whether that ancestry reached ``base``, so that a None
    is the whole truth). No clock is compared: snapshots are found by id."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    if current is None:
        return None, base is None
    for snapshot in ancestors_of(current, table.metadata):
        if snapshot.summary is not None and snapshot.summary[TOKEN] == token:
            return Found("snapshot", snapshot.snapshot_id), True
        if snapshot.snapshot_id == base:
            return None, True
    return None, False


def current_snapshot_id(table: Table) -> int | None:
    current = table.current_snapshot()
    return None if current is None else current.snapshot_id


def live_data_files(table: Table, paths: Iterable[str]) -> list[DataFile]:
    """The data files of the current snapshot among ``paths``, as its
    manifests hold them (what an overwrite deletes)."""
    wanted = set(paths)
    current = table.current_snapshot()
    if current is None or not wanted:
        return []
    from pyiceberg.manifest import DataFileContent, ManifestContent

    found = []
    for manifest in current.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA and entry.data_file.file_path in wanted:
                found.append(entry.data_file)
    return found


def without_commit_retries(table: Table) -> Table:
    """``table`` whose transactions make one try: a commit that loses to a
    concurrent writer is retried by :mod:`~airflow_eos.targets.iceberg.commit`
    itself, on the table loaded again, after looking for its token again
    (pyiceberg's own retry would append the files again)."""
    props = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    table.metadata = table.metadata.model_copy(update={"properties": props})
    return table


def data_file_rows(files: Iterable[DataFile]) -> int:
    return sum(f.record_count for f in files)


def iter_scan_tasks(table: Table) -> Iterator[Any]:
    """The current snapshot's file scan tasks (each with its delete files)."""
    if table.current_snapshot() is None:
        return iter(())
    return iter(table.scan().plan_files())
