"""A local Spark Connect server: one warm driver JVM for the stage tasks."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_eos.embedded.processes import free_port, stop_process, wait_for_port
from airflow_eos.spark.connector import connector_jars
from airflow_eos.spark.submit import WORKER_DAEMON_CONF

log = logging.getLogger("airflow_eos.embedded")

CONNECT_SERVER_APP = Path(__file__).resolve().parent.parent / "spark" / "connect_server.py"


class SparkConnectServer:
    """A local Spark Connect server (``local[N]``): one warm driver JVM that stage
    tasks connect to (``sc://127.0.0.1:port``) instead of each paying a
    spark-submit and a JVM start. Its Python workers run this interpreter, so
    they have airflow-eos. Listens on 127.0.0.1 only, no web UI.

    Run as airflow_eos/spark/connect_server.py, not Spark's SparkConnectServer
    class: its sessions share one set of Python daemons instead of starting five
    each (see that module), and the task workers fork from a daemon that has the
    stage job's imports done (airflow_eos.spark.daemon).
    """

    def __init__(self, master: str = "local[2]", conf: dict[str, str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.master = master
        self.conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            **WORKER_DAEMON_CONF,
            **(conf or {}),
        }
        # Spark's Kafka connector (and S3A), beside any jars of ``conf``: on the driver's and the executors'
        # classpath from the start
        self.conf["spark.jars"] = ",".join([*filter(None, self.conf.get("spark.jars", "").split(",")),
                                            *connector_jars()])
        self.spark_submit = Path(sys.executable).with_name("spark-submit")
        self.python = sys.executable
        self.env = env or {}  # for the driver and its Python workers (e.g. EOS_FAULTS in tests)
        self.logfile = tempfile.NamedTemporaryFile(prefix="eos-spark-connect-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        conf = [arg for key, value in self.conf.items() for arg in ("--conf", f"{key}={value}")]
        return [str(self.spark_submit), "--name", "airflow-eos Spark Connect", "--master", self.master, *conf,
                str(CONNECT_SERVER_APP)]

    def start(self, timeout: float = 120.0) -> "SparkConnectServer":
        env = {**os.environ, "PYSPARK_PYTHON": self.python, "SPARK_LOCAL_IP": "127.0.0.1", **self.env}
        started = time.monotonic()
        # A session of its own, so that stop() signals every process in it.
        self.proc = subprocess.Popen(self.command(), stdout=self.logfile, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            wait_for_port(self.port, timeout, self.proc)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            tail = Path(self.logfile.name).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"Spark Connect server did not start: {exc}\n{tail}") from exc
        self.start_seconds = time.monotonic() - started
        log.info("Spark Connect server on %s (%s) started in %.1fs; log %s", self.url, self.master,
                 self.start_seconds, self.logfile.name)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            # spark-submit's process group: the JVM and the launcher's Python driver; PySpark's
            # Python daemons (groups of their own) and workers exit when the JVM closes their stdin.
            stop_process(self.proc, grace=15.0, group=True)

    def __enter__(self) -> "SparkConnectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            os.unlink(self.logfile.name)
