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
- :meth:`HdfsFiles.atomic_output`: a file appears whole or not at all (a
  temp name, hsync'ed and closed, renamed over the old one).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import time
from collections.abc import Iterator
from typing import IO
from urllib.parse import unquote, urlsplit

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.targets.files.fs import Entry


def hdfs_root(text: str) -> str:
    """``hdfs://namenode:port/dir`` normalised (no trailing slash, no ``..``),
    or ConfigurationError saying why it cannot be a FileTarget's root."""
    parts = urlsplit(text)
    if not parts.netloc:
        raise ConfigurationError(f"{text} names no NameNode: write hdfs://namenode:port/absolute/directory (the "
                                 "NameNode's RPC address, or the nameservice of an HA cluster)")
    if parts.query or parts.fragment:
        raise ConfigurationError(f"{text}: a FileTarget's hdfs:// URL takes no query or fragment")
    path = posixpath.normpath(unquote(parts.path) or "/")
    if path == "/":
        raise ConfigurationError(f"FileTarget path {text} is the file system's root: give a directory of its own")
    return f"hdfs://{parts.netloc}{path}"


def split_url(url: str) -> tuple[str, str]:
    """``hdfs://namenode:port/a/b`` as (``hdfs://namenode:port``, ``/a/b``):
    the cluster a client connects to, and the path in it."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "hdfs":
        raise ConfigurationError(f"{url} is not an HDFS URL (hdfs://namenode:port/path)")
    root = hdfs_root(url)
    return f"hdfs://{parts.netloc}", root[len(f"hdfs://{parts.netloc}"):]


class HdfsFiles:
    """One HDFS cluster's files (:class:`~airflow_eos.targets.files.storage.Files`),
    by URL: ``hdfs://namenode:port/path``, the way the sink spells its paths."""

    def __init__(self, cluster: str) -> None:
        from hdfs_native import Client  # noqa: PLC0415 - the optional `hdfs` extra, loaded where HDFS is used

        self.cluster = cluster
        self.client = Client(cluster)

    def _path(self, url: str) -> str:
        if not url.startswith(self.cluster + "/"):
            raise ValueError(f"{url} is not a path of {self.cluster}")
        return url[len(self.cluster):]

    def _url(self, path: str) -> str:
        return self.cluster + path

    def exists(self, path: str) -> bool:
        try:
            self.client.get_file_info(self._path(path))
        except FileNotFoundError:
            return False
        return True

    def lexists(self, path: str) -> bool:
        return self.exists(path)

    def is_dir(self, path: str) -> bool:
        try:
            return self.client.get_file_info(self._path(path)).isdir
        except FileNotFoundError:
            return False

    def is_file(self, path: str) -> bool:
        try:
            return not self.client.get_file_info(self._path(path)).isdir
        except FileNotFoundError:
            return False

    def is_link(self, path: str) -> bool:
        return False  # HDFS's clients do not create symlinks (disabled in Hadoop 2 and later)

    def writable(self, path: str) -> bool:
        return True  # the NameNode checks permissions on each change; its refusal is the error to report

    def entries(self, path: str) -> list[Entry]:
        directory = self._path(path)
        found = []
        for status in self.client.list_status(directory, False):
            name = posixpath.basename(status.path)
            found.append(Entry(name, self._url(posixpath.join(directory, name)), status.isdir, not status.isdir,
                               status.length, status.modification_time / 1000))
        return sorted(found, key=lambda e: e.name)

    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        """As ``os.walk(top)``: top-down, ``dirs`` pruned in place by the caller."""
        try:
            entries = self.entries(top)
        except FileNotFoundError:
            return
        dirs = [e.name for e in entries if e.is_dir]
        yield top, dirs, [e.name for e in entries if not e.is_dir]
        for name in dirs:
            yield from self.walk(posixpath.join(top, name))

    def size(self, path: str) -> int:
        return self.client.get_file_info(self._path(path)).length

    def mtime(self, path: str) -> float:
        return self.client.get_file_info(self._path(path)).modification_time / 1000

    def makedirs(self, path: str) -> None:
        self.client.mkdirs(self._path(path), 0o755, True)

    def mkdir(self, path: str) -> None:
        """A new directory (its parent must exist). HDFS's mkdirs succeeds on
        an existing one: checked first, which is enough for the sink's names
        (each attempt's own)."""
        if self.exists(path):
            raise FileExistsError(errno.EEXIST, "File exists", path)
        self.client.mkdirs(self._path(path), 0o755, False)

    def rename(self, src: str, dst: str) -> None:
        self.client.rename(self._path(src), self._path(dst), False)

    def rename_noreplace(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``; FileExistsError if ``dst`` exists (even empty)."""
        self.client.rename(self._path(src), self._path(dst), False)

    def replace(self, src: str, dst: str, retired: str) -> None:
        """Put ``src`` where ``dst`` is, the old ``dst`` moved to ``retired``
        first (see the module's docstring for what readers see)."""
        self.makedirs(posixpath.dirname(retired))
        self.client.rename(self._path(dst), self._path(retired), False)
        self.client.rename(self._path(src), self._path(dst), False)

    def unlink(self, path: str) -> None:
        if not self.client.delete(self._path(path), False):
            raise FileNotFoundError(errno.ENOENT, "No such file", path)

    def remove_tree(self, path: str) -> bool:
        """Delete ``path`` and everything in it; True if it is gone (or never was)."""
        with contextlib.suppress(FileNotFoundError):
            self.client.delete(self._path(path), True)
        return not self.exists(path)

    def read_bytes(self, path: str) -> bytes:
        with self.client.read(self._path(path)) as f:
            return f.read()

    def open_input(self, path: str) -> IO[bytes]:
        return self.client.read(self._path(path))

    @contextlib.contextmanager
    def atomic_output(self, path: str) -> Iterator[IO[bytes]]:
        """A file that appears under ``path`` whole (synced to the DataNodes'
        disks) when the block ends, or not at all if it raises."""
        tmp = self._temp(path)
        try:
            with self.client.create(tmp, self._new_file()) as f:
                yield f
                f.hsync()
            self.client.rename(tmp, self._path(path), True)  # a file over a file: one atomic step
        except BaseException:
            with contextlib.suppress(OSError):
                self.client.delete(tmp, False)
            raise

    def write_atomically(self, path: str, data: bytes) -> None:
        """``path`` holds ``data`` whole, or keeps what it held: never a part."""
        with self.atomic_output(path) as f:
            f.write(data)

    def create_exclusive(self, path: str, data: bytes) -> None:
        """``path`` appears whole, and FileExistsError where anything holds it."""
        tmp = self._temp(path)
        try:
            with self.client.create(tmp, self._new_file()) as f:
                f.write(data)
                f.hsync()
            self.client.rename(tmp, self._path(path), False)
        finally:
            with contextlib.suppress(OSError):
                self.client.delete(tmp, False)

    def sync_dir(self, path: str) -> None:
        """Nothing to do: the NameNode logs each rename durably before it answers."""

    def sync_file(self, path: str) -> None:
        """Nothing to do: a file is hsync'ed before it gets its name (atomic_output),
        and Spark's writer closes its files before its job commits."""

    @staticmethod
    def _new_file():
        """A new file in a directory that must exist: a writer never recreates
        a deleted staging (HDFS's create makes missing parents by default)."""
        from hdfs_native import WriteOptions  # noqa: PLC0415 - the optional `hdfs` extra

        return WriteOptions(create_parent=False)

    def _temp(self, path: str) -> str:
        """A hidden name beside ``path`` (readers and the staging scan skip "." names)."""
        head, tail = posixpath.split(self._path(path))
        return posixpath.join(head, f".{tail}.{os.getpid()}.{time.monotonic_ns()}.tmp")
