"""The file system under a FileTarget's root, as one object: what the sink's
protocol does to files, said once for every file system that can hold a root.

:class:`LocalFiles` is the local POSIX directory (``fs.py``'s calls);
:class:`~airflow_eos.targets.files.hdfs.HdfsFiles` is HDFS. Both take paths as
the sink spells them (a local path; an ``hdfs://namenode:port/...`` URL), and
both pass the same contract (``tests/integration/test_file_systems.py``).
:func:`files_for` picks one by the root.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import IO, Protocol

from airflow_eos.targets.files import fs
from airflow_eos.targets.files.fs import Entry


class Files(Protocol):
    """What the file target does to files. A rename is one atomic step of the
    file system; ``rename_noreplace`` fails with FileExistsError where
    anything holds ``dst``, even an empty directory."""

    def exists(self, path: str) -> bool: ...  # a symlink counts as what it points to
    def lexists(self, path: str) -> bool: ...  # a symlink counts, even dangling
    def is_dir(self, path: str) -> bool: ...  # a directory, or a symlink to one
    def is_file(self, path: str) -> bool: ...  # a regular file, or a symlink to one
    def is_link(self, path: str) -> bool: ...
    def writable(self, path: str) -> bool: ...  # the directory takes new names (as far as can be told before)
    def entries(self, path: str) -> list[Entry]: ...  # FileNotFoundError if there is no such directory
    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]: ...  # as os.walk, top-down
    def size(self, path: str) -> int: ...
    def mtime(self, path: str) -> float: ...
    def makedirs(self, path: str) -> None: ...
    def mkdir(self, path: str) -> None: ...  # FileExistsError if it exists
    def rename(self, src: str, dst: str) -> None: ...  # into a name nothing else writes
    def rename_noreplace(self, src: str, dst: str) -> None: ...
    def replace(self, src: str, dst: str, retired: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def remove_tree(self, path: str) -> bool: ...
    def read_bytes(self, path: str) -> bytes: ...
    def open_input(self, path: str) -> IO[bytes]: ...  # seekable: pyarrow reads Parquet footers through it
    def atomic_output(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]: ...
    def write_atomically(self, path: str, data: bytes) -> None: ...
    def create_exclusive(self, path: str, data: bytes) -> None: ...  # whole, and only where nothing is
    def sync_dir(self, path: str) -> None: ...  # make the renames in ``path`` durable
    def sync_file(self, path: str) -> None: ...  # make a file's contents durable


class LocalFiles:
    """A local POSIX directory tree."""

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def lexists(self, path: str) -> bool:
        return os.path.lexists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def is_link(self, path: str) -> bool:
        return os.path.islink(path)

    def writable(self, path: str) -> bool:
        return os.access(path, os.W_OK | os.X_OK)

    def entries(self, path: str) -> list[Entry]:
        """The names of one directory and their stats, all read through one
        open descriptor: a replace exchanging ``path`` meanwhile gives the old
        version's names or the new one's, never "no such file" (a stat by path
        after the swap looks for an old name in the new directory)."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with os.scandir(fd) as listing:
                stats = [(e.name, e.stat(follow_symlinks=False)) for e in listing]
        finally:
            os.close(fd)
        return sorted((Entry(name, os.path.join(path, name), stat.S_ISDIR(st.st_mode), stat.S_ISREG(st.st_mode),
                             st.st_size, st.st_mtime) for name, st in stats), key=lambda e: e.name)

    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        return os.walk(top)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def mtime(self, path: str) -> float:
        return os.stat(path).st_mtime

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def rename_noreplace(self, src: str, dst: str) -> None:
        fs.rename_noreplace(src, dst)

    def replace(self, src: str, dst: str, retired: str) -> None:
        """One exchange (readers see the old version or the new one, never
        neither), then the old version, now at ``src``, moves to ``retired``."""
        fs.rename_exchange(src, dst)
        fs.fsync_dir(os.path.dirname(dst))
        os.makedirs(os.path.dirname(retired), exist_ok=True)
        os.rename(src, retired)
        fs.fsync_dir(os.path.dirname(retired))

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def remove_tree(self, path: str) -> bool:
        return fs.remove_tree(path)

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def open_input(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def atomic_output(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return fs.atomic_output(path)

    def write_atomically(self, path: str, data: bytes) -> None:
        fs.write_atomically(path, data)

    def create_exclusive(self, path: str, data: bytes) -> None:
        """A hard link of a synced temp file: ``path`` appears whole, and
        FileExistsError where anything holds it."""
        tmp = fs.temp_name(path)
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        fs.fsync_dir(os.path.dirname(path))

    def sync_dir(self, path: str) -> None:
        fs.fsync_dir(path)

    def sync_file(self, path: str) -> None:
        fs.fsync_file(path)


_LOCAL = LocalFiles()
_CLUSTERS: dict[tuple[str, int], Files] = {}


def files_for(root: str) -> Files:
    """The file system that holds ``root`` (a local path, or an ``hdfs://`` URL).
    One client per cluster and process (a forked Spark worker makes its own:
    a client's connections do not survive a fork)."""
    if root.startswith("hdfs://"):
        from airflow_eos.targets.files.hdfs import HdfsFiles, split_url  # noqa: PLC0415 - the optional extra

        cluster = split_url(root)[0]
        key = (cluster, os.getpid())
        if key not in _CLUSTERS:
            _CLUSTERS[key] = HdfsFiles(cluster)
        return _CLUSTERS[key]
    return _LOCAL
