"""The file operations of the Iceberg target, on whatever store the table's
location is (a local directory, ``s3://``, ``gs://``, ``abfs://``, HDFS): through
pyiceberg's Arrow file IO, configured by the catalog's ``s3.*``, ``gcs.*``,
``adls.*``, ``hdfs.*`` properties.

Nothing here renames a directory: a window's files are written once, where
they stay, and a snapshot that names them is what publishes them. A file is
written under a hidden name and moved to its own name when complete (on an
object store, where a move is a copy, an object appears whole when its
upload ends anyway), so a listing never counts half a file.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_eos.core.staged_files import delete_while_written

if TYPE_CHECKING:
    import pyarrow as pa
    from pyarrow.fs import FileSystem

# The catalog properties a file IO reads (never a catalog's own credential or URI).
IO_PREFIXES = ("s3.", "gcs.", "adls.", "hdfs.", "client.", "py-io-impl", "oss.", "hf.")


def io_properties(catalog: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in catalog.items() if k.startswith(IO_PREFIXES)}


# pyiceberg's S3 file IO properties as Hadoop's S3A settings: what Spark's own writer needs to reach the
# same store with the same credentials (from the catalog's connection, never from a DAG).
_S3A = {"s3.endpoint": "fs.s3a.endpoint", "s3.access-key-id": "fs.s3a.access.key",
        "s3.secret-access-key": "fs.s3a.secret.key", "s3.session-token": "fs.s3a.session.token",
        "s3.region": "fs.s3a.endpoint.region"}


def s3a_settings(io: Mapping[str, str]) -> dict[str, str]:
    """The S3A settings of ``io`` (pyiceberg properties). An endpoint of its
    own (MinIO, Ceph, a test server) is reached by path-style requests, as
    pyarrow's S3 file system does, unless ``s3.force-virtual-addressing``."""
    settings = {hadoop: io[key] for key, hadoop in _S3A.items() if key in io}
    if "s3.endpoint" in io:
        virtual = str(io.get("s3.force-virtual-addressing", "false")).lower() == "true"
        settings["fs.s3a.path.style.access"] = "false" if virtual else "true"
    if "s3.session-token" in io:
        settings["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return settings


def visible(name: str) -> bool:
    return not name.startswith(("_", "."))


def chunk_id(name: str) -> int:
    """The chunk a staged file belongs to: a 63-bit hash of its file name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") >> 1


def names_digest(names: Iterable[str]) -> str:
    """A chunk's checksum: a digest of its files' names (a file is written
    once under a random name and never changed)."""
    return hashlib.blake2b("\0".join(sorted(names)).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Listed:
    name: str
    bytes: int


@dataclass(frozen=True)
class Store:
    """The store of a table's files, by URL. Plain data (picklable for Spark
    tasks): its file systems are made where it is used."""

    properties_json: str = "{}"

    def __getstate__(self) -> dict[str, str]:
        return {"properties_json": self.properties_json}  # not the file systems cached_property made

    def __setstate__(self, state: Mapping[str, str]) -> None:
        object.__setattr__(self, "properties_json", state["properties_json"])

    @cached_property
    def _io(self):
        from pyiceberg.io.pyarrow import PyArrowFileIO
        return PyArrowFileIO(json.loads(self.properties_json))

    def s3a_settings(self) -> dict[str, str]:
        return s3a_settings(json.loads(self.properties_json))

    def _fs(self, url: str) -> tuple[FileSystem, str]:
        from pyiceberg.io.pyarrow import PyArrowFileIO
        scheme, netloc, path = PyArrowFileIO.parse_location(url)
        return self._io.fs_by_scheme(scheme, netloc), path

    def is_local(self, url: str) -> bool:
        from pyarrow.fs import LocalFileSystem
        return isinstance(self._fs(url)[0], LocalFileSystem)

    def listing(self, url: str) -> list[Listed]:
        """The visible files directly under ``url``, by name (none if it is not there)."""
        from pyarrow.fs import FileSelector, FileType
        fs, path = self._fs(url)
        infos = fs.get_file_info(FileSelector(path, allow_not_found=True, recursive=False))
        return sorted((Listed(i.base_name, i.size) for i in infos if i.type == FileType.File and visible(i.base_name)),
                      key=lambda f: f.name)

    def subdirectories(self, url: str) -> list[str]:
        from pyarrow.fs import FileSelector, FileType
        fs, path = self._fs(url)
        infos = fs.get_file_info(FileSelector(path, allow_not_found=True, recursive=False))
        return sorted(i.base_name for i in infos if i.type == FileType.Directory)

    def size(self, url: str) -> int | None:
        from pyarrow.fs import FileType
        fs, path = self._fs(url)
        info = fs.get_file_info(path)
        return info.size if info.type == FileType.File else None

    def is_dir(self, url: str) -> bool:
        from pyarrow.fs import FileType
        fs, path = self._fs(url)
        return fs.get_file_info(path).type == FileType.Directory

    def make_dirs(self, url: str) -> None:
        fs, path = self._fs(url)
        fs.create_dir(path, recursive=True)

    def write_empty(self, url: str) -> None:
        fs, path = self._fs(url)
        with fs.open_output_stream(path):
            pass

    def delete_file(self, url: str) -> None:
        fs, path = self._fs(url)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass

    def delete_tree(self, url: str) -> None:
        """Delete ``url`` and everything in it, again while a zombie task
        still writes into it (core.staged_files.delete_while_written)."""
        fs, path = self._fs(url)
        delete_while_written(lambda: fs.delete_dir(path))

    def footer(self, url: str) -> tuple[int, pa.Schema]:
        """(rows, Arrow schema) of a Parquet file, from its footer only."""
        import pyarrow.parquet as pq
        fs, path = self._fs(url)
        with fs.open_input_file(path) as f:
            meta = pq.read_metadata(f)
        return meta.num_rows, meta.schema.to_arrow_schema().remove_metadata()

    def read_table(self, url: str, columns: list[str] | None = None) -> pa.Table:
        import pyarrow.parquet as pq
        fs, path = self._fs(url)
        return pq.read_table(path, filesystem=fs, columns=columns)

    def write_parquet(self, url: str, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
        """Write ``tables`` as one Parquet file at ``url``, under a hidden name
        first; returns its rows. The directory must exist where the store has
        directories: a writer never makes again a staging an abort deleted."""
        import pyarrow.parquet as pq
        fs, path = self._fs(url)
        directory, _, name = path.rpartition("/")
        tmp = f"{directory}/.{name}.{secrets.token_hex(4)}.tmp"
        rows = 0
        try:
            with fs.open_output_stream(tmp) as sink, pq.ParquetWriter(sink, schema, compression="snappy") as out:
                for table in tables:
                    out.write_table(table)
                    rows += table.num_rows
            fs.move(tmp, path)
        except BaseException:
            try:
                fs.delete_file(tmp)
            except OSError:
                pass
            raise
        return rows
