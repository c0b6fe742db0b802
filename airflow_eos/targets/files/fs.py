"""The few POSIX file-system operations the file target's protocol rests on.

- :func:`rename_noreplace`: publish a directory under a name only if nothing
  holds that name (``renameat2(RENAME_NOREPLACE)`` on Linux; plain ``rename``
  would silently replace an *empty* directory of that name).
- :func:`rename_exchange`: swap two directories in one atomic step
  (``renameat2(RENAME_EXCHANGE)``, Linux 3.15+, ext4, xfs, btrfs, tmpfs, ...):
  a reader of either name sees the old directory or the new one, never neither.
- :func:`atomic_output`, :func:`write_atomically`: a file appears whole or not
  at all (temp name, fsync, rename, fsync of the directory).
- :func:`fsync_dir`: make a rename durable.
- :class:`Entry`: one name in a directory, as every file system lists it
  (``storage.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from airflow_eos.core.staged_files import delete_while_written

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "arm64": 276, "ppc64le": 357, "s390x": 347, "riscv64": 276}


@dataclass(frozen=True)
class Entry:
    """One name in a directory."""

    name: str
    path: str
    is_dir: bool  # a directory (a symlink to one is not)
    is_file: bool  # a regular file (a symlink to one is not)
    size: int
    mtime: float  # seconds since the epoch


class RenameUnsupported(OSError):
    """The platform or file system cannot rename atomically as asked."""


_renameat2 = None


def _call_renameat2(src: str, dst: str, flags: int) -> None:
    global _renameat2
    if not sys.platform.startswith("linux"):
        raise RenameUnsupported(errno.ENOSYS, "renameat2 is Linux-only")
    if _renameat2 is None:
        libc = ctypes.CDLL(None, use_errno=True)
        if hasattr(libc, "renameat2"):  # glibc >= 2.28
            fn = libc.renameat2
            fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)

            def call(a: bytes, b: bytes, f: int) -> int:
                return fn(_AT_FDCWD, a, _AT_FDCWD, b, f)
        else:  # older libc: the system call itself
            number = _SYS_RENAMEAT2.get(os.uname().machine)
            if number is None:
                raise RenameUnsupported(errno.ENOSYS, f"renameat2 unknown on {os.uname().machine}")
            syscall = libc.syscall

            def call(a: bytes, b: bytes, f: int) -> int:
                return syscall(ctypes.c_long(number), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(a),
                               ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(b), ctypes.c_uint(f))
        _renameat2 = call
    if _renameat2(os.fsencode(src), os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise RenameUnsupported(code, f"{os.strerror(code)} (renameat2 flags {flags})", src)
        raise OSError(code, os.strerror(code), src, None, dst)


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; FileExistsError if ``dst`` exists (even empty).
    Where renameat2 is missing, a check then ``rename`` (a racing creator of
    ``dst`` could slip in between: the protocol holds the window's ledger lock,
    so only a hand could)."""
    try:
        _call_renameat2(src, dst, RENAME_NOREPLACE)
    except RenameUnsupported:
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "File exists", dst) from None
        os.rename(src, dst)


def rename_exchange(a: str, b: str) -> None:
    """Swap the directories ``a`` and ``b`` atomically. RenameUnsupported where
    the platform or file system cannot (no fallback: two renames would leave a
    moment with ``b`` missing)."""
    _call_renameat2(a, b, RENAME_EXCHANGE)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(final: str) -> str:
    """A hidden name beside ``final`` (readers and the staging scan skip "." names)."""
    head, tail = os.path.split(final)
    return os.path.join(head, f".{tail}.{os.getpid()}.{time.monotonic_ns()}.tmp")


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[bytes]]:
    """A file that appears under ``path`` whole (synced) when the block ends,
    or not at all if it raises."""
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def write_atomically(path: str, data: bytes) -> None:
    """``path`` holds ``data`` whole, or keeps what it held: never a part."""
    with atomic_output(path) as f:
        f.write(data)


def remove_tree(path: str) -> bool:
    """Delete ``path`` and everything in it, again while a writer still adds
    files to it (core.staged_files.delete_while_written); True if it is gone
    (or never was)."""
    delete_while_written(lambda: shutil.rmtree(path))
    return not os.path.lexists(path)

