"""HDFS, one NameNode and one DataNode in one JVM (Hadoop's own test cluster,
``MiniDFSCluster``, run by its ``MiniDFSClusterManager`` main), from the jars
scripts/bootstrap.sh fetched (hdfs_home)."""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
from pathlib import Path

from airflow_eos.core.jars import JarCache
from airflow_eos.embedded.processes import SMALL_JVM_FLAGS, JvmService, wait_for_port

log = logging.getLogger("airflow_eos.embedded")

# The Hadoop release of the client jars PySpark ships (pyspark/jars/hadoop-client-api-*.jar): Spark's
# client and the cluster are one release. scripts/hdfs/pom.xml names the same (tests/unit/test_deployment.py).
HADOOP_VERSION = "3.5.0"

MANAGER = "org.apache.hadoop.test.MiniDFSClusterManager"


HDFS_JARS = JarCache(f"hdfs-{HADOOP_VERSION}", f"Hadoop {HADOOP_VERSION}'s mini-cluster jars", "EOS_HDFS_HOME",
                     "hadoop-client-minicluster-*.jar", "scripts/hdfs/pom.xml")


def hdfs_home() -> Path:
    """Where scripts/bootstrap.sh put Hadoop's mini-cluster jars (``lib/``)."""
    return HDFS_JARS.home()


class HdfsCluster(JvmService):
    """A NameNode and a DataNode in one JVM on 127.0.0.1, on ports the
    NameNode chooses (free ones: no race with another process picking the
    same), its storage in a temp dir that lives until the cluster is
    destroyed. ``url`` (``hdfs://127.0.0.1:PORT``) is what a client and
    Spark's ``hdfs://`` paths name; ``http_address`` serves WebHDFS."""

    def __init__(self, heap: str = "384m") -> None:
        self.heap = heap
        self.dir = Path(tempfile.mkdtemp(prefix="eos-hdfs-"))
        self.logfile = self.dir / "cluster.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.http_address = ""
        self.started_seconds = 0.0

    @property
    def url(self) -> str:
        return f"hdfs://127.0.0.1:{self.port}"

    def _command(self, details: Path, config: Path) -> list[str]:
        return ["java", f"-Xmx{self.heap}", *SMALL_JVM_FLAGS,
                "-cp", HDFS_JARS.classpath(),
                MANAGER, "-format", "-datanodes", "1", "-nnport", "0", "-httpport", "0",
                "-writeDetails", str(details), "-writeConfig", str(config),
                "-D", f"hdfs.minidfs.basedir={self.dir / 'data'}",
                # one DataNode: a file's single replica is enough, and no pipeline recovery looks for a second
                "-D", "dfs.replication=1",
                "-D", "dfs.client.block.write.replace-datanode-on-failure.enable=false",
                # the tests' trees are small; no permission checks between the test's user and the cluster's
                "-D", "dfs.permissions.enabled=false"]

    def start(self, timeout: float = 120.0) -> "HdfsCluster":
        started = time.monotonic()
        details, config = self.dir / "details.json", self.dir / "hdfs-site.xml"
        details.unlink(missing_ok=True)
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(self._command(details, config), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            # the manager writes its details once the NameNode and the DataNode are active
            deadline = started + timeout
            while not details.exists() or not details.read_text().strip():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the mini-cluster exited with {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the mini-cluster wrote no {details.name} within {timeout}s")
                time.sleep(0.1)
            self.port = int(json.loads(details.read_text())["namenode_port"])
            self.http_address = _setting(config, "dfs.namenode.http-address").replace("localhost", "127.0.0.1")
            wait_for_port(self.port, max(1.0, deadline - time.monotonic()), self.proc)
        except (RuntimeError, TimeoutError, ValueError, KeyError) as exc:
            self.stop()
            raise RuntimeError(f"HDFS did not start: {exc}\n{self.log_tail()}") from exc
        self.started_seconds = time.monotonic() - started
        log.info("HDFS (Hadoop %s mini-cluster) on %s started in %.1fs (log %s)", HADOOP_VERSION, self.url,
                 self.started_seconds, self.logfile)
        return self



def _setting(config: Path, name: str) -> str:
    """One property of the Hadoop configuration XML the manager wrote."""
    import xml.etree.ElementTree as ET  # noqa: PLC0415 - read once per cluster start

    for prop in ET.parse(config).getroot().iter("property"):
        if prop.findtext("name") == name:
            return prop.findtext("value") or ""
    raise KeyError(f"{name} is not in {config}")
