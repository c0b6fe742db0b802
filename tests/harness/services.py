"""The run's PostgreSQL server and Apache Kafka broker, one of each for all of
a run's pytest-xdist workers.

The controller starts them when it brings up its first worker and hands their
addresses to every worker (xdist's ``workerinput``); a run without xdist starts
them in its one session, when a test first needs them. Either way
``EOS_POSTGRES_URL`` / ``EOS_KAFKA_BOOTSTRAP`` name external ones instead.

Sharing is safe because each test keeps to names of its own: a fresh database
(``pg_url``) and uniquely named topics, so transactional ids and consumer
groups, which the targets derive from the topic, differ too. Tests that stop,
restart or reconfigure a server start one of their own; the end-to-end tests,
which run the example DAGs on the DAGs' fixed topic names, have a broker of
their worker's own (tests/e2e/conftest.py).

Why share: a server per worker is CPU the tests wait for. A broker costs
~4.6 CPU-s to start and ~1.4 CPU-s a minute idle, and ``make test-fast`` runs
more workers than the machine has cores.

HDFS is shared too, but started only when a test first asks for it
(:func:`on_demand`): it costs ~7 CPU-s to start, and five of ``make
test-fast``'s workers each started one. (Not Iceberg's REST catalog: its
JdbcCatalog on SQLite is not meant for writers in parallel.) A worker's session may end
while others still use a service, so the controller owns them: a worker leaves
a request file in the run's directory, the controller's thread starts the
service and writes its address beside it (``ON_DEMAND``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from airflow_eos.embedded import (
    ServiceHandle,
    hdfs_service,
    kafka_service,
    postgres_service,
)

_WORKERINPUT_KEY = "eos_services"
# Room for each worker's sessions: two workers' tests held at most 41 at once (make test-fast, -n 2).
CONNECTIONS_PER_WORKER = 100

# The services a test starts by asking for them, shared by the run's workers: each test keeps
# to paths of its own. The value: the handle's attributes a test reads besides its address
# (test_hdfs_files speaks WebHDFS).
ON_DEMAND: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "hdfs": (hdfs_service, ("http_address",)),
}
ON_DEMAND_TIMEOUT_S = 300

_running: contextlib.ExitStack | None = None
_addresses: dict[str, str] = {}


def hand_to_worker(node) -> None:
    """In the xdist controller, for each worker it brings up: the run's services'
    addresses into the worker's ``workerinput`` (started with the first worker,
    side by side)."""
    global _running
    if _running is None:
        workers = int(node.config.getoption("numprocesses") or 1)
        with contextlib.ExitStack() as stack:
            pg, kafka = _start_side_by_side(
                stack, postgres_service(max_connections=100 + CONNECTIONS_PER_WORKER * workers), kafka_service())
            served = stack.enter_context(_OnDemand())
            _addresses.update(postgres=pg.address, kafka=kafka.address, on_demand=str(served.directory))
            _running = stack.pop_all()
    node.workerinput[_WORKERINPUT_KEY] = dict(_addresses)


def stop() -> None:
    """Stop what :func:`hand_to_worker` started (at the end of the run)."""
    global _running
    if _running is not None:
        _running.close()
        _running = None


def _start_side_by_side(stack: contextlib.ExitStack, *services) -> list[ServiceHandle]:
    """Enter the services' context managers in threads (each waits mostly on its
    process starting); each one entered is exited by ``stack``, a failed one raises."""
    with ThreadPoolExecutor(len(services)) as pool:
        futures = [pool.submit(service.__enter__) for service in services]
    handles = []
    for service, future in zip(services, futures):
        if future.exception() is None:
            stack.push(service.__exit__)
            handles.append(future.result())
    for future in futures:
        future.result()  # raises the first failure, after the others are on the stack
    return handles


class _OnDemand:
    """The controller's side of :func:`on_demand`: a thread starting each service
    asked for in ``directory`` once, and stopping them all on exit."""

    def __init__(self):
        self.directory = Path(tempfile.mkdtemp(prefix="eos-services-"))
        self._started = contextlib.ExitStack()
        self._served: set[str] = set()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="eos-on-demand-services", daemon=True)

    def __enter__(self) -> "_OnDemand":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._thread.join()
        self._started.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _serve(self) -> None:
        while not self._closing.wait(0.1):
            for request in self.directory.glob("*.request"):
                if request.stem not in self._served:
                    self._served.add(request.stem)
                    self._start(request.stem)

    def _start(self, name: str) -> None:
        try:
            service, attributes = ON_DEMAND[name]
            handle = self._started.enter_context(service())
            answer = {"address": handle.address, **{a: getattr(handle.embedded, a) for a in attributes}}
            _write(self.directory / f"{name}.json", json.dumps(answer))
        except Exception as exc:  # noqa: BLE001 - the asking worker raises it, with its test
            _write(self.directory / f"{name}.error", f"{type(exc).__name__}: {exc}")


def _write(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    os.replace(partial, path)


@contextlib.contextmanager
def on_demand(config, name: str) -> Iterator[ServiceHandle]:
    """This session's ``name`` (a key of ``ON_DEMAND``): the run's, started by
    the controller when a worker first asks; else one of its own."""
    directory = _shared(config, "on_demand")
    if not directory:
        with ON_DEMAND[name][0]() as handle:
            yield handle
        return
    directory = Path(directory)
    (directory / f"{name}.request").touch()
    deadline = time.monotonic() + ON_DEMAND_TIMEOUT_S
    while not (directory / f"{name}.json").exists():
        if (directory / f"{name}.error").exists():
            raise RuntimeError(f"the run's {name} did not start: {(directory / f'{name}.error').read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run's {name} did not start in {ON_DEMAND_TIMEOUT_S}s (asked in {directory})")
        time.sleep(0.1)
    answer = json.loads((directory / f"{name}.json").read_text())
    yield ServiceHandle(answer.pop("address"), SimpleNamespace(**answer) if answer else None)


@contextlib.contextmanager
def postgres(config) -> Iterator[ServiceHandle]:
    """This session's PostgreSQL server: the run's, in an xdist worker; else one of its own."""
    shared = _shared(config, "postgres")
    if shared:
        yield ServiceHandle(shared)
        return
    with postgres_service() as handle:
        yield handle


@contextlib.contextmanager
def kafka(config) -> Iterator[ServiceHandle]:
    """This session's Kafka broker: the run's, in an xdist worker; else one of its own."""
    shared = _shared(config, "kafka")
    if shared:
        yield ServiceHandle(shared)
        return
    with kafka_service() as handle:
        yield handle


def _shared(config, name: str) -> str | None:
    return getattr(config, "workerinput", {}).get(_WORKERINPUT_KEY, {}).get(name)
