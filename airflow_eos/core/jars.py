"""Java libraries the package runs (Apache Kafka, Hadoop's mini-cluster, Spark's
Kafka connector and S3A, Iceberg's REST catalog server): fetched once by ``make setup`` (scripts/bootstrap.sh runs
Maven on a small pom per library) into a cache outside the checkout, found
there by every process; nothing is downloaded at run time. A directory given
by the library's environment variable (a Docker image's) comes first."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

COMPLETE = ".complete"  # written by the bootstrap once every jar of a library is in place


@dataclass(frozen=True)
class JarCache:
    """One library's jars: ``home()/lib/*.jar``."""

    folder: str  # its folder in the cache, with its version: "kafka-4.1.1"
    title: str  # for the error: "Apache Kafka 4.1.1's jars"
    env: str  # the environment variable naming another home
    marker: str  # a glob of the jar that must be there
    pom: str  # the pom the bootstrap fetches it with

    def home(self) -> Path:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return Path(os.environ.get(self.env) or cache / "airflow-eos" / self.folder)

    def jars(self) -> list[str]:
        """Every jar of the library; a clear error naming ``make setup`` when they are not there."""
        lib = self.home() / "lib"
        if not (self.home() / COMPLETE).exists() or not any(lib.glob(self.marker)):
            raise RuntimeError(f"{self.title} are not in {lib}: run `make setup` (it fetches them with Maven from "
                               f"{self.pom}), or point {self.env} at a directory whose lib/ holds them")
        return sorted(str(p) for p in lib.glob("*.jar"))

    def classpath(self) -> str:
        """A JVM classpath of every jar (checked first)."""
        self.jars()
        return f"{self.home() / 'lib'}/*"
