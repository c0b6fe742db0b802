"""The file operations the file target's protocol rests on (see ``fs.py`` for
the local ones), on HDFS: each a single NameNode operation, atomic for every
client of the cluster.

The client is ``hdfs-native`` (PyPI, the ``hdfs`` extra): HDFS's RPC protocol
spoken from Rust, in the process that publishes (the commit task, the sweep),
with no JVM, libhdfs or Spark session. The alternatives fail the protocol's
needs: Spark's JVM (``FileSystem`` through py4j) exists only in a classic
Spark session, never in the commit task nor on Spark Connect; WebHDFS's
``op=RENAME`` is ``FileSystem.rename`` unless given ``renameoptions``, and
needs the NameNode's HTTP port open to the workers.

- :meth:`HdfsFiles.rename_noreplace`: the NameNode's ``rename2`` with
  ``Options.Rename.NONE``: fails if the destination exists, even as an empty
  directory (``FileSystem.rename`` would move the source *into* it).
- :meth:`HdfsFiles.replace`: HDFS has no exchange of two names. Two renames,
  the old version to ``retired`` first, then the new one into place: a reader
  listing the directory sees the old version whole, then for the moment
  between the two renames no window, then the new version whole; never a mix
  of both. A crash between them leaves the new version staged, and the next
  publication of the decided window renames it into place.
- :meth:`HdfsFiles.write_atomically`: a file appears whole or not at all (a
  temp name, closed, renamed over the old one).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
from urllib.parse import urlsplit

from airflow_eos.core.errors import ConfigurationError


def split_url(url: str) -> tuple[str, str]:
    """``hdfs://namenode:port/a/b`` as (``hdfs://namenode:port``, ``/a/b``):
    the cluster a client connects to, and the path in it."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "hdfs" or not parts.netloc:
        raise ConfigurationError(f"{url} is not an HDFS URL with a NameNode (hdfs://namenode:port/path)")
    if parts.query or parts.fragment:
        raise ConfigurationError(f"{url}: an HDFS root takes no query or fragment")
    path = posixpath.normpath(parts.path or "/")
    if path == "/":
        raise ConfigurationError(f"{url} is the file system's root: give a directory of its own")
    return f"hdfs://{parts.netloc}", path


class HdfsFiles:
    """One HDFS cluster's file operations, by absolute path in the cluster."""

    def __init__(self, cluster: str) -> None:
        from hdfs_native import Client  # noqa: PLC0415 - the optional `hdfs` extra, loaded where HDFS is used

        self.cluster = cluster
        self.client = Client(cluster)

    def rename_noreplace(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``; FileExistsError if ``dst`` exists (even empty)."""
        self.client.rename(src, dst, False)

    def replace(self, src: str, dst: str, retired: str) -> None:
        """Put ``src`` where ``dst`` is, the old ``dst`` moved to ``retired``
        first (see the module's docstring for what readers see)."""
        self.client.rename(dst, retired, False)
        self.client.rename(src, dst, False)

    def write_atomically(self, path: str, data: bytes) -> None:
        """``path`` holds ``data`` whole, or keeps what it held: never a part."""
        head, tail = posixpath.split(path)
        tmp = posixpath.join(head, f".{tail}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            with self.client.create(tmp) as f:
                f.write(data)
            self.client.rename(tmp, path, True)  # a file over a file: one atomic step
        except BaseException:
            with contextlib.suppress(OSError):
                self.client.delete(tmp, False)
            raise

    def read(self, path: str) -> bytes:
        with self.client.read(path) as f:
            return f.read()

    def makedirs(self, path: str) -> None:
        self.client.mkdirs(path, 0o755, True)

    def is_dir(self, path: str) -> bool:
        try:
            return self.client.get_file_info(path).isdir
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        try:
            self.client.get_file_info(path)
        except FileNotFoundError:
            return False
        return True

    def list_names(self, path: str) -> list[str]:
        """The names in the directory ``path`` (FileNotFoundError if there is none)."""
        return sorted(posixpath.basename(s.path) for s in self.client.list_status(path, False))

    def remove_tree(self, path: str) -> bool:
        """Delete ``path`` and everything in it; True if it is gone (or never was)."""
        with contextlib.suppress(FileNotFoundError):
            self.client.delete(path, True)
        return not self.exists(path)
