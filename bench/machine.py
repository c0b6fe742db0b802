"""The machine a run measured on: cores, memory, kernel, versions, and the
other processes busy at its start (a shared machine gives lower figures)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "?"


def machine_info(pg_url: str) -> dict:
    import psycopg

    from airflow_eos.embedded import KAFKA_VERSION

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    with psycopg.connect(pg_url) as conn:
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {"nproc": os.cpu_count(), "memory_gib": round(mem / 2**30, 1), "cpu": cpu,
            "kernel": platform.release(),
            "versions": {"python": platform.python_version(), "apache-airflow": _version("apache-airflow"),
                         "pyspark": _version("pyspark"), "psycopg": _version("psycopg"),
                         "confluent-kafka": _version("confluent-kafka"), "pyarrow": _version("pyarrow"),
                         "postgresql": pg_version, "kafka": KAFKA_VERSION, "java": java[0] if java else "?"}}


def heavy_processes() -> list[str]:
    """Other processes using a lot of CPU now (a JVM, pytest, spark workers)."""
    import psutil

    mine = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(1.0)
    busy = []
    for p in procs:
        try:
            if p.pid not in mine and p.cpu_percent(None) > 30:
                busy.append(f"{p.pid} {' '.join(p.info['cmdline'] or [p.info['name']])[:100]}")
        except psutil.Error:
            pass
    return busy
