"""A full disk, for real: a small tmpfs mounted for one test (the tests run as
root) and filled by a ballast file, and a transform whose output is too large for
what is left. Used through the real Spark job, local and on Spark Connect."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

ORDERS = "airflow_eos.examples.transforms:orders"
BLOB_HASHES = 24  # 24 SHA-256 hex digests a row: ~1.5 KB that neither snappy nor a dictionary shrinks


@contextmanager
def small_file_system(size: str = "8m") -> Iterator[str]:
    """A real tmpfs of ``size``, mounted in a new temp directory; unmounted and
    removed afterwards whatever happened."""
    mount_point = tempfile.mkdtemp(prefix="eos-small-fs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", mount_point], check=True)
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", mount_point]).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], check=True)  # a process still holds a file: detach it
        os.rmdir(mount_point)


def fill(path: str, leave: int) -> str:
    """A ballast file that leaves ``leave`` bytes free on the file system of ``path``."""
    ballast = os.path.join(path, "ballast")
    size = shutil.disk_usage(path).free - leave
    with open(ballast, "wb") as f:
        f.write(b"\0" * size)
    return ballast


def orders_with_blob(df):
    """The example orders transform plus an incompressible column: a few hundred
    orders then take ~1 MB of Parquet."""
    from pyspark.sql import functions as F

    from airflow_eos.spark.transform import load_transform

    out = load_transform(ORDERS)(df)
    seed = F.concat_ws("/", F.col("eos_topic"), F.col("eos_partition"), F.col("eos_offset"))
    return out.withColumn("blob", F.concat(*[F.sha2(F.concat(seed, F.lit(f"#{i}")), 256) for i in range(BLOB_HASHES)]))
