"""FileTarget: the spec a DAG names (plain values, cheap to import).

A DAG file builds ``FileTarget(path="/data/lake/orders", postgres_conn_id=...)``
at parse time, so this module imports neither pyarrow nor psycopg: the sink
(:mod:`airflow_eos.targets.files.sink`) is built from the bound spec at run
time. Everything that can be refused without touching the file system or the
ledger is refused here, at parse time: an object store, a relative path, a
layout that would hide its windows from readers or let two windows collide.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote, urlsplit

from airflow_eos.core.database import redact
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.target import DEFAULT_CONN_IDS, PATH, POSTGRES, ConnectionRef, TargetSpec, uri_part
from airflow_eos.targets.files.hdfs import hdfs_root
from airflow_eos.targets.files.identity import root_aliases, root_id
from airflow_eos.targets.files.layout import DEFAULT_LAYOUT, DEFAULT_REPLACED_RETENTION, Layout

if TYPE_CHECKING:
    from airflow_eos.targets.files.sink import FileSink

FORMATS = ("parquet",)
ON_COMMITTED = ("skip", "replace")

# Schemes whose stores have no atomic rename of a directory: a "rename" there is
# a copy of every object and a delete, which readers can observe half done, and
# a crash leaves half done. Refused, never faked.
OBJECT_STORES = {
    "s3": "Amazon S3", "s3a": "Amazon S3", "s3n": "Amazon S3", "gs": "Google Cloud Storage",
    "gcs": "Google Cloud Storage", "abfs": "Azure Data Lake Storage", "abfss": "Azure Data Lake Storage",
    "wasb": "Azure Blob Storage", "wasbs": "Azure Blob Storage", "adl": "Azure Data Lake Storage Gen1",
    "oss": "Alibaba OSS", "cos": "Tencent COS", "cosn": "Tencent COS", "obs": "Huawei OBS",
    "r2": "Cloudflare R2", "minio": "MinIO", "swift": "OpenStack Swift", "b2": "Backblaze B2",
    "az": "Azure Blob Storage", "azure": "Azure Blob Storage", "http": "HTTP", "https": "HTTP",
}
# Hadoop file systems that do rename a directory atomically, not supported yet: viewfs (a rename
# across two mount points fails) and WebHDFS (its RENAME is FileSystem.rename unless told otherwise).
ATOMIC_RENAME_NOT_YET = {"viewfs": "HDFS (viewfs)", "webhdfs": "WebHDFS", "swebhdfs": "WebHDFS"}


def local_root(path: str) -> str:
    """The root that ``path`` names: an absolute local directory (a path or a
    file:// URL), or an ``hdfs://`` URL; ConfigurationError saying why it
    cannot be a FileTarget's root."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigurationError("FileTarget needs path='/absolute/directory' (the root of the published windows)")
    text = path.strip()
    # A scheme is what precedes the first ":" of a URL ("file:/x", "file:///x", "s3://b/x"), never of an
    # absolute path ("/data/a:b").
    scheme = "" if text.startswith("/") else urlsplit(text).scheme.lower()
    if scheme in OBJECT_STORES:
        raise ConfigurationError(
            f"FileTarget cannot publish into {text} ({OBJECT_STORES[scheme]}): an object store has no atomic "
            "rename, so a window would be published by copying objects one by one, and a reader or a crash would "
            "see it half published. Use a table format with a transaction log for object stores (Delta Lake, "
            "Apache Iceberg, Apache Hudi); FileTarget supports local POSIX directories (a path or file://) and "
            "HDFS (hdfs://)")
    if scheme in ATOMIC_RENAME_NOT_YET:
        raise ConfigurationError(
            f"FileTarget does not support {ATOMIC_RENAME_NOT_YET[scheme]} ({text}) yet: give the cluster's "
            "hdfs://namenode:port/directory URL (its client renames on the NameNode), or a local directory")
    if scheme == "hdfs":
        return hdfs_root(text)
    if scheme and scheme != "file":
        raise ConfigurationError(f"FileTarget does not know the scheme {scheme!r} of {text}: give a local "
                                 "directory, as an absolute path or a file:// URL, or an hdfs:// URL")
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise ConfigurationError(f"{text} names the host {parts.netloc!r}: a file:// URL of a FileTarget "
                                     "must be local (file:///absolute/path)")
        if parts.query or parts.fragment:
            raise ConfigurationError(f"{text}: a FileTarget's file:// URL takes no query or fragment")
        text = unquote(parts.path)
        if not os.path.isabs(text):
            raise ConfigurationError(
                f"FileTarget path {path.strip()!r} names no absolute directory: write a local root as "
                "file:/absolute/path, file:///absolute/path or /absolute/path")
    if not os.path.isabs(text):
        raise ConfigurationError(
            f"FileTarget path {text!r} is relative: give an absolute path, which means the same directory to the "
            "scheduler, the workers and the Spark executors")
    root = os.path.normpath(text)
    if root == "/":
        raise ConfigurationError("FileTarget path '/' is the file system's root: give a directory of its own")
    return root


_CONN_ID = re.compile(r"^[\w.\-]+$")


@dataclass(frozen=True)
class FileTarget(TargetSpec):
    """A directory of Parquet files, one partition directory per window, as a
    two-phase-commit target (see :mod:`airflow_eos.targets.files.sink`).

    - ``path``: the root directory, local (an absolute path or ``file:///...``)
      or on HDFS (``hdfs://namenode:port/...``, the ``hdfs`` extra: its
      client renames on the NameNode). It must exist and be writable by the
      tasks and the Spark executors.
      Object stores (``s3://``, ``gs://``, ``abfs://``, ...) are refused: they
      have no atomic rename (use a table format there).
    - ``format``: ``parquet``.
    - ``postgres_conn_id``: the PostgreSQL database that holds the ledger
      (schema ``eos``); a file system has no transactions of its own.
    - ``ledger_url``: that database's URL, outside Airflow (tests, scripts); a
      DAG names the connection instead.
    - ``on_committed``: committing a window that is committed already:
      ``skip`` (nothing; reported) or ``replace`` (the window's partition
      directory is swapped for the new one in one atomic rename).
    - ``replaced_retention``: how long the old version of a replaced window
      stays in ``_eos_trash/`` before a later commit or the sweep deletes it
      (default 10 min): a query that began listing the partition just before
      the replace reads the whole old version, not a half-deleted one.
    - ``layout``: the window's partition directory under the root (see Layout).
    """

    path: str = ""
    format: str = "parquet"
    postgres_conn_id: str = DEFAULT_CONN_IDS[POSTGRES]
    ledger_url: str | None = None
    on_committed: str = "skip"
    layout: str = DEFAULT_LAYOUT
    replaced_retention: timedelta = DEFAULT_REPLACED_RETENTION

    kind: ClassVar[str] = "files"
    id_scheme: ClassVar[str] = "files"

    def __post_init__(self) -> None:
        local_root(self.path)
        retention = self.replaced_retention
        if isinstance(retention, (int, float)) and not isinstance(retention, bool):
            object.__setattr__(self, "replaced_retention", timedelta(seconds=retention))  # to_dict's seconds
        elif not isinstance(retention, timedelta):
            raise ConfigurationError(f"replaced_retention must be a timedelta, not {retention!r}")
        if self.replaced_retention < timedelta(0):
            raise ConfigurationError(f"replaced_retention must not be negative, not {retention!r}")
        if self.format not in FORMATS:
            raise ConfigurationError(f"FileTarget format must be one of {FORMATS}, not {self.format!r}")
        if self.on_committed not in ON_COMMITTED:
            raise ConfigurationError(f"on_committed must be one of {ON_COMMITTED}, not {self.on_committed!r}")
        Layout(self.layout)
        if not isinstance(self.postgres_conn_id, str) or not _CONN_ID.match(self.postgres_conn_id):
            raise ConfigurationError(f"postgres_conn_id must name an Airflow connection, not {self.postgres_conn_id!r}")

    def __repr__(self) -> str:
        where = redact(self.ledger_url) if self.ledger_url else f"connection {self.postgres_conn_id!r}"
        return (f"FileTarget({self.root!r}, format={self.format!r}, layout={self.layout!r}, "
                f"on_committed={self.on_committed!r}, ledger in {where})")

    @property
    def root(self) -> str:
        return local_root(self.path)

    # ------------------------------------------------------------------ the spec (core/target.py)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "format": self.format,
                "postgres_conn_id": self.postgres_conn_id, "ledger_url": self.ledger_url,
                "on_committed": self.on_committed, "layout": self.layout,
                "replaced_retention": self.replaced_retention.total_seconds()}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "FileTarget":
        return cls(**dict(fields))

    @classmethod
    def from_target_name(cls, name: str) -> "FileTarget":
        """The root directory ``name``, as :attr:`target_id` writes it."""
        return cls(path=name)

    def connections(self) -> tuple[ConnectionRef, ...]:
        return () if self.ledger_url else (ConnectionRef("ledger", POSTGRES, self.postgres_conn_id),)

    def bind(self, values: Mapping[str, Any]) -> "FileTarget":
        return self if self.ledger_url else dataclasses.replace(self, ledger_url=values["ledger"])

    def sink(self) -> "FileSink":
        if not self.ledger_url:
            raise ConfigurationError(f"{self!r} is not bound: resolve postgres_conn_id (bind) before building its "
                                     "sink")
        from airflow_eos.targets.files.sink import FileSink
        return FileSink(root=self.root, ledger_url=self.ledger_url, layout=self.layout,
                        on_committed=self.on_committed, format=self.format,
                        replaced_retention_s=self.replaced_retention.total_seconds())

    @property
    def ledger_conn_id(self) -> str:
        return self.postgres_conn_id

    @property
    def target_id(self) -> str:
        """``files:/real/root``: two specs naming one directory (a path and
        its file:// URL, a trailing slash, a symlink to it) are one target. Read
        where the plan runs (the directory's symlinks as the workers see them)."""
        return root_id(self.root)

    @property
    def target_aliases(self) -> tuple[str, ...]:
        return root_aliases(self.root)

    @property
    def exclusive(self) -> bool:
        """The root takes one pipeline's windows unless the layout tells
        pipelines apart: two pipelines' windows would otherwise share
        partition directories."""
        return "{pipeline}" not in self.layout

    @property
    def asset_uri(self) -> str:
        """``file:///root`` (``hdfs://namenode/root``), the path percent-encoded
        (``uri_part``): a root with a space, ``ü``, ``#`` or ``?`` names its own
        asset, not a cut-short one."""
        root = self.root
        if root.startswith("hdfs://"):
            parts = urlsplit(root)
            return f"hdfs://{parts.netloc}" + uri_part(parts.path, PATH)
        return "file://" + uri_part(root, PATH)

    @property
    def label(self) -> str:
        return self.root

    def check_for_dag(self) -> None:
        if self.ledger_url:
            raise ConfigurationError("in a DAG, name the ledger's database with postgres_conn_id, not ledger_url: "
                                     "a URL would put its password into the DAG and the task logs")
