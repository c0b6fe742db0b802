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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from airflow_eos.embedded import ServiceHandle, kafka_service, postgres_service

_WORKERINPUT_KEY = "eos_services"
# Room for each worker's sessions: two workers' tests held at most 41 at once (make test-fast, -n 2).
CONNECTIONS_PER_WORKER = 100

_running: contextlib.ExitStack | None = None
_addresses: dict[str, str] = {}


def hand_to_worker(node) -> None:
    """In the xdist controller, for each worker it brings up: the run's services'
    addresses into the worker's ``workerinput`` (started with the first worker)."""
    global _running
    if _running is None:
        workers = int(node.config.getoption("numprocesses") or 1)
        with contextlib.ExitStack() as stack:
            pg = stack.enter_context(postgres_service(max_connections=100 + CONNECTIONS_PER_WORKER * workers))
            kafka = stack.enter_context(kafka_service())
            _addresses.update(postgres=pg.address, kafka=kafka.address)
            _running = stack.pop_all()
    node.workerinput[_WORKERINPUT_KEY] = dict(_addresses)


def stop() -> None:
    """Stop what :func:`hand_to_worker` started (at the end of the run)."""
    global _running
    if _running is not None:
        _running.close()
        _running = None


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
