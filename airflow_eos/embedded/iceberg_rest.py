"""An Apache Iceberg REST catalog: Iceberg's own REST catalog test server
(``org.apache.iceberg.rest.RESTCatalogServer``, what the apache/iceberg-rest-fixture
image runs), the REST spec served over a JdbcCatalog on a SQLite file, its
warehouse a local directory, from the jars scripts/bootstrap.sh fetched
(iceberg_rest_home)."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

from airflow_eos.core.jars import JarCache
from airflow_eos.embedded.processes import SMALL_JVM_FLAGS, JvmService, free_port, wait_for_port

log = logging.getLogger("airflow_eos.embedded")

# A release pyiceberg 0.12 talks to (REST spec of 1.10). scripts/iceberg-rest/pom.xml names the same
# (tests/unit/test_deployment.py).
ICEBERG_VERSION = "1.10.1"

# RESTCatalogServer's servlet and backend catalog behind a connector on 127.0.0.1 (the server itself binds
# every interface): a single-file Java program the JVM compiles at its start.
LAUNCHER = Path(__file__).with_name("LocalRestCatalog.java")


ICEBERG_REST_JARS = JarCache(f"iceberg-rest-{ICEBERG_VERSION}",
                             f"Iceberg {ICEBERG_VERSION}'s REST catalog server jars", "EOS_ICEBERG_REST_HOME",
                             "iceberg-open-api-*-test-fixtures.jar", "scripts/iceberg-rest/pom.xml")


def iceberg_rest_home() -> Path:
    """Where scripts/bootstrap.sh put the REST catalog server's jars (``lib/``)."""
    return ICEBERG_REST_JARS.home()


class IcebergRestCatalog(JvmService):
    """The REST catalog server in one JVM on 127.0.0.1 and a free port
    (through :data:`LAUNCHER`), its SQLite catalog and its warehouse in a temp dir that lives
    until the server is destroyed. ``uri`` is what pyiceberg's REST client
    names (catalog properties ``{"type": "rest", "uri": ...}``)."""

    def __init__(self, heap: str = "256m") -> None:
        self.heap = heap
        self.dir = Path(tempfile.mkdtemp(prefix="eos-iceberg-rest-"))
        self.warehouse = self.dir / "warehouse"
        self.logfile = self.dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.started_seconds = 0.0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _environment(self) -> dict[str, str]:
        # RCKUtils turns CATALOG_* variables into the backend catalog's properties ("_" -> ".", "__" -> "-")
        return {**os.environ, "CATALOG_URI": f"jdbc:sqlite:{self.dir / 'catalog.db'}",
                "CATALOG_WAREHOUSE": self.warehouse.as_uri(), "CATALOG_REST_PORT": str(self.port),
                "CATALOG_JDBC_SCHEMA__VERSION": "V1"}

    def start(self, timeout: float = 90.0) -> "IcebergRestCatalog":
        started = time.monotonic()
        self.warehouse.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        command = ["java", f"-Xmx{self.heap}", *SMALL_JVM_FLAGS,
                   "-cp", ICEBERG_REST_JARS.classpath(), str(LAUNCHER), str(self.port)]
        with open(self.logfile, "ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self._environment(),
                                         start_new_session=True)
        try:
            wait_for_port(self.port, timeout, self.proc)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            raise RuntimeError(f"the Iceberg REST catalog did not start: {exc}\n{self.log_tail()}") from exc
        self.started_seconds = time.monotonic() - started
        log.info("Iceberg REST catalog (Iceberg %s's RESTCatalogServer) on %s started in %.1fs (log %s)",
                 ICEBERG_VERSION, self.uri, self.started_seconds, self.logfile)
        return self

