"""A live Airflow 3.3 stack for tests and the demo, and a small REST client for it.

    with postgres_database(pg_server_url) as meta_url, \\
            airflow_stack(home, metadata_url=meta_url, dags_folder="dags",
                          connections={"kafka_default": {...}, ...}) as stack:
        stack.client.unpause("orders_hourly")
        stack.airflow("backfill", "create", "--dag-id", "orders_hourly", ...)
        stack.client.wait_for_run("orders_hourly", run_id)

What runs, each as a subprocess in its own process group:

- ``airflow api-server -H 127.0.0.1 -p FREEPORT -w 1`` (REST API, UI, and the
  Execution API the tasks talk to);
- ``airflow dag-processor``;
- ``airflow scheduler --skip-serve-logs`` with the LocalExecutor (it forks the
  task processes, so they inherit the stack's environment: connections,
  ``EOS_FAULTS``, ...);
- ``airflow triggerer --skip-serve-logs`` when asked for (deferrable tasks).

Nothing listens on anything but 127.0.0.1 (the log servers are skipped). The
environment is self-contained: inherited ``AIRFLOW__*``, ``AIRFLOW_CONN_*`` and
``AIRFLOW_VAR_*`` variables are dropped (a test session's SQLite and unit-test
settings must not leak into the stack); pass ``env=`` to add your own.
Connections are given as ``AIRFLOW_CONN_*`` variables. Cron scheduling is off by
default (``use_job_schedule=False``): backfills, REST-triggered runs and clears
still run, but an unpaused DAG does not also start a run of the latest interval
on its own.

The metadata DB is a PostgreSQL database (recommended: SQLite under a live
scheduler with parallel tasks locks) or, without ``metadata_url``, SQLite in the
home. :func:`postgres_database` makes a throwaway database on a server.

Stopping: SIGTERM to every process group, SIGKILL after a grace period, then
SIGKILL to any descendant still alive (a ``spark-submit`` JVM a task left
behind), also when starting failed half-way.

No Airflow imports here (the client is plain ``urllib``): the test process may
have its own, differently configured Airflow loaded.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_eos.embedded import free_port

log = logging.getLogger(__name__)

AIRFLOW_BIN = Path(sys.executable).with_name("airflow")
FINISHED = ("success", "failed")

_DROPPED_PREFIXES = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")
_DROPPED = ("AIRFLOW_HOME", "AIRFLOW_CONFIG")


# --------------------------------------------------------------------------- metadata database


def sqlalchemy_url(libpq_url: str) -> str:
    """``postgresql://…`` as SQLAlchemy's psycopg2 URL, which Airflow's metadata DB uses."""
    scheme, sep, rest = libpq_url.partition("://")
    if not sep or scheme not in ("postgres", "postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {libpq_url.split('@')[-1]!r}")
    return f"postgresql+psycopg2://{rest}"


@contextlib.contextmanager
def postgres_database(server_url: str, prefix: str = "airflow_meta") -> Iterator[str]:
    """A fresh database on the server at ``server_url`` (a libpq URL with rights
    to create databases); yields its libpq URL and drops it afterwards."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server_url.partition("?")[0].rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------- REST client


class AirflowAPIError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


class AirflowClient:
    """The api-server's public REST API (``/api/v2``), with ``urllib`` only.

    With ``[core] simple_auth_manager_all_admins`` the api-server authenticates
    every request as an admin, so no token is needed; if it answers 401 anyway
    the client fetches one from ``GET /auth/token`` (allowed without credentials
    in that mode) and retries with it.
    """

    # generous: with one api-server worker on a 2-core machine shared with Spark jobs
    # (load ~25 seen), an answer took over 30 s
    def __init__(self, base_url: str, timeout: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None

    # ----------------------------------------------------------------- plumbing

    def request(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode(
                [(k, v) for k, vs in params.items() for v in (vs if isinstance(vs, (list, tuple)) else [vs])])
        data = json.dumps(body, default=_json_default).encode() if body is not None else None
        for attempt in range(2):
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                text = exc.read().decode(errors="replace")
                if exc.code == 401 and attempt == 0 and not path.startswith("/auth/"):
                    self._token = self._fetch_token()
                    continue
                raise AirflowAPIError(method, path, exc.code, text) from None
        raise AssertionError("unreachable")

    def _fetch_token(self) -> str:
        req = urllib.request.Request(self.base_url + "/auth/token", method="GET")
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())["access_token"]

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    # ----------------------------------------------------------------- health, DAGs

    def health(self) -> dict:
        return self.get("/api/v2/monitor/health")

    def dag(self, dag_id: str) -> dict:
        return self.get(f"/api/v2/dags/{_q(dag_id)}")

    def import_errors(self) -> list[dict]:
        return self.get("/api/v2/importErrors")["import_errors"]

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> dict:
        """Until the dag-processor has parsed and stored ``dag_id``; fails early
        with the import error if its file does not import."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.dag(dag_id)
            except AirflowAPIError as exc:
                if exc.status != 404:
                    raise
            errors = [e for e in self.import_errors() if dag_id in str(e.get("filename", "")) or
                      dag_id in str(e.get("stack_trace", ""))]
            if errors:
                raise RuntimeError(f"DAG {dag_id} does not import: {errors[0].get('stack_trace')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"DAG {dag_id} not parsed after {timeout}s; import errors: {self.import_errors()}")
            time.sleep(0.5)

    def set_paused(self, dag_id: str, paused: bool) -> dict:
        return self.request("PATCH", f"/api/v2/dags/{_q(dag_id)}", {"is_paused": paused},
                            params={"update_mask": "is_paused"})

    def unpause(self, dag_id: str) -> dict:
        return self.set_paused(dag_id, False)

    def pause(self, dag_id: str) -> dict:
        return self.set_paused(dag_id, True)

    # ----------------------------------------------------------------- runs

    def dag_runs(self, dag_id: str, **filters: Any) -> list[dict]:
        """Runs of ``dag_id``, oldest logical date first. ``filters``: the API's
        query parameters (``run_type=["backfill"]``, ``state=["failed"]``, ...)."""
        return self.get(f"/api/v2/dags/{_q(dag_id)}/dagRuns", limit=100, order_by="logical_date",
                        **filters)["dag_runs"]

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}")

    def trigger(self, dag_id: str, *, logical_date: datetime | None = None,
                data_interval: tuple[datetime, datetime] | None = None, run_id: str | None = None,
                conf: dict | None = None) -> dict:
        body: dict[str, Any] = {"logical_date": logical_date, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        if data_interval:
            body["data_interval_start"], body["data_interval_end"] = data_interval
        return self.request("POST", f"/api/v2/dags/{_q(dag_id)}/dagRuns", body)

    def wait_for_run(self, dag_id: str, run_id: str, states: Iterable[str] = FINISHED, timeout: float = 300,
                     poll: float = 1.0) -> dict:
        """Until the run is in one of ``states``; returns the run."""
        states = tuple(states)
        deadline = time.monotonic() + timeout
        while True:
            run = self.dag_run(dag_id, run_id)
            if run["state"] in states:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} of {dag_id} is {run['state']} after {timeout}s, not one of "
                                   f"{states}; task instances: {self.ti_states(dag_id, run_id)}")
            time.sleep(poll)

    def wait_for_runs(self, dag_id: str, count: int, states: Iterable[str] = FINISHED, timeout: float = 300,
                      poll: float = 2.0, **filters: Any) -> list[dict]:
        """Until at least ``count`` runs (matching ``filters``) exist and all of them
        are in one of ``states``; returns them."""
        states = tuple(states)
        deadline = time.monotonic() + timeout
        while True:
            runs = self.dag_runs(dag_id, **filters)
            if len(runs) >= count and all(r["state"] in states for r in runs):
                return runs
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {timeout}s: {[(r['dag_run_id'], r['state']) for r in runs]}")
            time.sleep(poll)

    # ----------------------------------------------------------------- task instances

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.get(f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances",
                        limit=100)["task_instances"]

    def ti_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """``{task_id: state}`` of a run (for assertions and failure messages)."""
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def clear_task_instances(self, dag_id: str, run_id: str, task_ids: Iterable[str] | None = None, *,
                             only_failed: bool = False, include_downstream: bool = False,
                             include_upstream: bool = False, reset_dag_runs: bool = True,
                             dry_run: bool = False) -> list[dict]:
        """The UI's Clear: ``POST /api/v2/dags/{dag_id}/clearTaskInstances`` for one
        run (all its tasks, or ``task_ids`` — e.g. every task of a task group).
        With ``reset_dag_runs`` the run goes back to queued at once, so a
        following :meth:`wait_for_run` waits for the rerun. Returns the cleared
        task instances."""
        body: dict[str, Any] = {
            "dry_run": dry_run, "dag_run_id": run_id, "only_failed": only_failed,
            "reset_dag_runs": reset_dag_runs, "include_downstream": include_downstream,
            "include_upstream": include_upstream,
        }
        if task_ids is not None:
            body["task_ids"] = list(task_ids)
        return self.request("POST", f"/api/v2/dags/{_q(dag_id)}/clearTaskInstances", body)["task_instances"]

    def clear_task_group(self, dag_id: str, run_id: str, group_id: str, **kwargs: Any) -> list[dict]:
        """Clear every task of the task group ``group_id`` in one run."""
        tasks = [ti["task_id"] for ti in self.task_instances(dag_id, run_id)
                 if ti["task_id"].startswith(group_id + ".")]
        if not tasks:
            raise ValueError(f"run {run_id} of {dag_id} has no task in group {group_id!r}")
        return self.clear_task_instances(dag_id, run_id, tasks, **kwargs)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        return self.get(f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances/{_q(task_id)}"
                        f"/xcomEntries/{_q(key)}")["value"]

    # ----------------------------------------------------------------- backfills

    def create_backfill(self, dag_id: str, from_date: datetime, to_date: datetime, *, max_active_runs: int = 10,
                        reprocess_behavior: str = "none") -> dict:
        return self.request("POST", "/api/v2/backfills", {
            "dag_id": dag_id, "from_date": from_date, "to_date": to_date, "max_active_runs": max_active_runs,
            "reprocess_behavior": reprocess_behavior})

    def backfills(self, dag_id: str) -> list[dict]:
        return self.get("/api/v2/backfills", dag_id=dag_id)["backfills"]

    def wait_for_backfill(self, backfill_id: int, timeout: float = 300, poll: float = 2.0) -> dict:
        """Until the scheduler has marked the backfill completed (all its runs finished)."""
        deadline = time.monotonic() + timeout
        while True:
            backfill = self.get(f"/api/v2/backfills/{backfill_id}")
            if backfill.get("completed_at"):
                return backfill
            if time.monotonic() > deadline:
                raise TimeoutError(f"backfill {backfill_id} not completed after {timeout}s")
            time.sleep(poll)


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value} would be read as UTC or rejected; give a timezone")
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {value!r}")


# --------------------------------------------------------------------------- the stack


@dataclass
class StackProcess:
    name: str
    proc: subprocess.Popen
    log_path: Path


class AirflowStack:
    """api-server, dag-processor, scheduler (and triggerer) over one metadata DB.

    :param home: AIRFLOW_HOME (created if missing); logs go to ``home/logs``
        (task logs) and ``home/stack-logs`` (the processes' own output)
    :param dags_folder: the DAGs to run
    :param metadata_url: libpq URL of an empty PostgreSQL database for Airflow's
        metadata (see :func:`postgres_database`); None: SQLite in ``home``
    :param connections: ``{conn_id: dict or URI}``, given as ``AIRFLOW_CONN_*``
    :param env: more environment for every process (and so every task)
    :param triggerer: also run a triggerer (needed by deferrable tasks)
    :param use_job_schedule: let the scheduler create runs from DAG schedules
    :param parallelism: task slots of the LocalExecutor
    :param min_file_process_interval: seconds between two parses of a DAG file
    """

    def __init__(
        self,
        home: str | os.PathLike,
        *,
        dags_folder: str | os.PathLike,
        metadata_url: str | None = None,
        connections: Mapping[str, Mapping[str, Any] | str] | None = None,
        env: Mapping[str, str] | None = None,
        triggerer: bool = False,
        use_job_schedule: bool = False,
        parallelism: int = 4,
        min_file_process_interval: int = 300,
        port: int | None = None,
        startup_timeout: float = 180,
        stop_grace: float = 10,
    ):
        self.home = Path(home).resolve()
        self.dags_folder = Path(dags_folder).resolve()
        self.metadata_url = metadata_url
        self.connections = dict(connections or {})
        self.extra_env = dict(env or {})
        self.with_triggerer = triggerer
        self.use_job_schedule = use_job_schedule
        self.parallelism = parallelism
        self.min_file_process_interval = min_file_process_interval
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.processes: list[StackProcess] = []
        self.log_dir = self.home / "stack-logs"
        self.client = AirflowClient(self.url)
        self.timings: dict[str, float] = {}
        # Secrets every process of this stack shares (the api-server issues the
        # tasks' JWTs, the scheduler's workers present them), new for each stack.
        self._secrets = {
            "fernet": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            "jwt": secrets.token_hex(32),
            "api": secrets.token_hex(32),
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ----------------------------------------------------------------- environment

    @property
    def env(self) -> dict[str, str]:
        """The environment of every process of the stack (and of its CLI calls)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED}
        if self.metadata_url:
            db = sqlalchemy_url(self.metadata_url)
        else:
            db = f"sqlite:///{self.home}/airflow.db"
        bin_dir = str(Path(sys.executable).parent)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__FERNET_KEY": self._secret("fernet"),
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt"),
            "AIRFLOW__API__SECRET_KEY": self._secret("api"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(self.use_job_schedule),
            # parse each DAG file at start, then rarely: the machine is small
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(self.min_file_process_interval),
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            "PYTHONUNBUFFERED": "1",
        })
        for conn_id, conn in self.connections.items():
            env[f"AIRFLOW_CONN_{conn_id.upper()}"] = conn if isinstance(conn, str) else json.dumps(conn)
        env.update(self.extra_env)
        return env

    def _secret(self, name: str) -> str:
        return self._secrets[name]

    # ----------------------------------------------------------------- CLI

    def airflow(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``airflow ARGS`` against this stack (e.g. ``backfill create``)."""
        res = subprocess.run([str(AIRFLOW_BIN), *args], env=self.env, capture_output=True, text=True, check=False,
                             timeout=timeout, cwd=self.home, start_new_session=True)
        if check and res.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} exited {res.returncode}:\n{res.stdout[-3000:]}\n"
                               f"{res.stderr[-3000:]}")
        return res

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> AirflowStack:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        started = time.monotonic()
        try:
            self.airflow("db", "migrate", timeout=self.startup_timeout)
            self.timings["migrate"] = time.monotonic() - started
            self._spawn("api-server", "api-server", "-H", "127.0.0.1", "-p", str(self.port), "-w", "1")
            self._spawn("dag-processor", "dag-processor")
            self._spawn("scheduler", "scheduler", "--skip-serve-logs")
            if self.with_triggerer:
                self._spawn("triggerer", "triggerer", "--skip-serve-logs")
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - started
        log.info("Airflow stack at %s healthy after %.1fs", self.url, self.timings["start"])
        return self

    def _spawn(self, name: str, *args: str) -> None:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen([str(AIRFLOW_BIN), *args], env=self.env, cwd=self.home, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes.append(StackProcess(name, proc, log_path))

    def wait_healthy(self, timeout: float) -> dict:
        """Until the api-server answers and reports the metadata DB, the
        scheduler, the dag-processor (and the triggerer) healthy."""
        wanted = ["metadatabase", "scheduler", "dag_processor"] + (["triggerer"] if self.with_triggerer else [])
        deadline = time.monotonic() + timeout
        health: dict | str = "no answer"
        while time.monotonic() < deadline:
            for p in self.processes:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{self.tail(p.name)}")
            try:
                health = self.client.health()
            except (OSError, AirflowAPIError) as exc:
                health = f"{type(exc).__name__}: {exc}"
            else:
                if all((health.get(k) or {}).get("status") == "healthy" for k in wanted):
                    return health
            time.sleep(0.5)
        raise TimeoutError(f"Airflow stack not healthy after {timeout}s: {health}\n{self.tail()}")

    def tail(self, name: str | None = None, lines: int = 40) -> str:
        """The last lines of one process's output (or of all), for failure messages."""
        out = []
        for p in self.processes:
            if name is None or p.name == name:
                text = p.log_path.read_text(errors="replace").splitlines() if p.log_path.exists() else []
                out.append(f"--- {p.name} ({p.log_path})\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def lines_with(self, needle: str, after: int = 3, most: int = 60) -> str:
        """Each process's output lines that mention ``needle`` (e.g. a task
        instance's id) and the ``after`` lines that follow each (a traceback),
        for failure messages: a tail may start after what went wrong."""
        out = []
        for p in self.processes:
            text = p.log_path.read_text(errors="replace").splitlines() if p.log_path.exists() else []
            keep = sorted({j for i, line in enumerate(text) if needle in line
                           for j in range(i, min(i + after + 1, len(text)))})
            if keep:
                out.append(f"--- {p.name} lines with {needle} ({p.log_path})\n"
                           + "\n".join(text[j] for j in keep[-most:]))
        return "\n".join(out)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task try's log file, read from ``home/logs`` (same machine)."""
        base = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        path = base / f"attempt={try_number}.log"
        return path.read_text(errors="replace") if path.exists() else f"(no log at {path})"

    def stop(self) -> None:
        """Stop everything this stack started: SIGTERM to each process group,
        SIGKILL after the grace period, then SIGKILL to leftover descendants."""
        alive = [p for p in self.processes if p.proc.poll() is None]
        tree = _descendants({p.proc.pid for p in alive})
        for p in alive:
            _signal_group(p.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        for p in alive:
            try:
                p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # children started meanwhile, and children of children whose parent was killed
        tree |= _descendants({p.proc.pid for p in alive} | {pid for pid, _ in tree})
        for p in self.processes:
            # the group may outlive its leader: kill it whole, whatever the leader did
            _signal_group(p.proc.pid, signal.SIGKILL)
            if p.proc.poll() is None:
                p.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(timeout=10)
        for pid, start in tree:
            if _start_time(pid) == start:  # still the process we saw, not a reused pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.processes = []

    def __enter__(self) -> AirflowStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def airflow_stack(home: str | os.PathLike, **kwargs: Any) -> Iterator[AirflowStack]:
    """Start an :class:`AirflowStack`, yield it healthy, stop it whatever happens."""
    stack = AirflowStack(home, **kwargs)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


# --------------------------------------------------------------------------- processes


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _descendants(roots: set[int]) -> set[tuple[int, int]]:
    """(pid, start time) of every live descendant of ``roots`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[tuple[int, int]] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            start = _start_time(child)
            if start is not None and (child, start) not in found:
                found.add((child, start))
                todo.append(child)
    return found
