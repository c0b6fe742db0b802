"""Apicurio Registry, a schema registry with Confluent's REST API and in-memory
storage, from the Quarkus build scripts/bootstrap.sh made (schema_registry_home)."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from airflow_eos.embedded.processes import SMALL_JVM_FLAGS, JvmService, free_port

log = logging.getLogger("airflow_eos.embedded")

# scripts/schema-registry/pom.xml names the same (tests/unit/test_deployment.py)
SCHEMA_REGISTRY_VERSION = "2.1.5.Final"

# Confluent's REST API (what confluent-kafka's SchemaRegistryClient speaks), under the registry's root
CCOMPAT_PATH = "/apis/ccompat/v6"


def schema_registry_home() -> Path:
    """Where scripts/bootstrap.sh built the registry (``build/``)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    default = cache / "airflow-eos" / f"schema-registry-{SCHEMA_REGISTRY_VERSION}"
    return Path(os.environ.get("EOS_SCHEMA_REGISTRY_HOME") or default)


def schema_registry_jar() -> Path:
    jar = schema_registry_home() / "build" / "schema-registry-1-runner.jar"
    if not (schema_registry_home() / ".complete").exists() or not jar.exists():
        raise RuntimeError(f"Apicurio Registry {SCHEMA_REGISTRY_VERSION} is not built in {jar.parent}: run "
                           "`make setup` (it builds it with Maven from scripts/schema-registry/pom.xml), or point "
                           "EOS_SCHEMA_REGISTRY_HOME at a directory whose build/ holds it")
    return jar


class SchemaRegistry(JvmService):
    """The registry on 127.0.0.1 and a free port, its schemas in memory (gone
    when it stops). ``url`` is what a SchemaRegistryClient is given."""

    def __init__(self, heap: str = "256m") -> None:
        self.heap = heap
        self.dir = Path(tempfile.mkdtemp(prefix="eos-schema-registry-"))
        self.logfile = self.dir / "registry.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.started_seconds = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def _command(self) -> list[str]:
        return ["java", f"-Xmx{self.heap}", *SMALL_JVM_FLAGS, "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.http.port={self.port}", f"-Djava.io.tmpdir={self.dir}", "-jar", str(schema_registry_jar())]

    def start(self, timeout: float = 180.0) -> "SchemaRegistry":
        started = time.monotonic()
        self.port = free_port()
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(self._command(), stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
                                         start_new_session=True)
        try:
            self._wait_ready(started + timeout)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            raise RuntimeError(f"the schema registry did not start: {exc}\n{self.log_tail()}") from exc
        self.started_seconds = time.monotonic() - started
        log.info("schema registry (Apicurio Registry %s) on %s started in %.1fs (log %s)", SCHEMA_REGISTRY_VERSION,
                 self.url, self.started_seconds, self.logfile)
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Until the registry's readiness check answers 200 (its storage is up)."""
        ready = f"http://127.0.0.1:{self.port}/health/ready"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the registry exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(ready, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ready} did not answer 200 in time")
            time.sleep(0.2)

