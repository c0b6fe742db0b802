"""How the bench measures: peak RSS of the Spark process trees (TreeMemory),
core-seconds by part of the run (CpuMeter, CpuSpan), the median of repeated
runs, and the PostgreSQL checkpoint that starts each measured run from the
same state."""

from __future__ import annotations

import statistics
import threading
import time


def checkpoint(url: str) -> None:
    """Start each measured run from the same PostgreSQL state. A 1M-row window
    writes 150-230 MB of WAL; without this, the WAL of the runs before triggers
    a checkpoint in the middle of the next one, whose writes compete with it
    (the same partitioned window's Spark job: 5.8-7.4 s, 6.2-6.3 s after a
    CHECKPOINT)."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.Error as exc:  # an external server may refuse a non-superuser
        print(f"bench: CHECKPOINT refused ({exc}); a run may overlap a checkpoint", flush=True)



# --------------------------------------------------------------------------- peak memory


class TreeMemory:
    """Samples the summed RSS of the spark-submit process trees under this process:
    the Spark Connect server's (``connect=True``) or every other one."""

    def __init__(self, interval: float = 0.2, *, connect: bool = False):
        self.interval = interval
        self.connect = connect
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            try:
                for proc in me.children(recursive=True):
                    try:
                        cmdline = " ".join(proc.cmdline())
                        if ("org.apache.spark.deploy.SparkSubmit" not in cmdline
                                or ("airflow-eos Spark Connect" in cmdline) != self.connect):
                            continue
                        tree = [proc, *proc.children(recursive=True)]
                        total += sum(p.memory_info().rss for p in tree)
                    except psutil.Error:
                        continue
            except psutil.Error:
                pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- CPU


CPU_PARTS = ("broker", "spark", "postgres", "bench", "ended", "ours", "machine")


class CpuMeter:
    """Core-seconds spent between two snapshots by each part of the run: the
    broker, the Spark processes (the Connect server's tree, or a session's JVM
    and its Python workers), PostgreSQL (postmaster and backends), this process
    (dag.test runs the Airflow tasks in it; the clients' own work), and ended
    children (spawned consumers, spark-submits). A process's time includes its
    reaped children's, so a Python worker or backend that exits inside a
    measurement is still counted, under its parent. ``machine`` is every core's
    busy time, others' load included: ``machine - ours`` is the noise.

    A window that must do a ceiling's work needs at least that ceiling's
    core-seconds; with the cores the ceilings keep busy, the sum of two
    ceilings' CPU over the cores bounds the window's time from below."""

    def __init__(self, pg_url: str | None):
        import psutil

        self.postmaster = None
        if pg_url:
            import psycopg

            try:
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
                self.postmaster = psutil.Process(psutil.Process(backend).ppid())
            except (psycopg.Error, psutil.Error):  # an external server on another host
                self.postmaster = None

    @staticmethod
    def _tree_seconds(root) -> float:
        import psutil

        total = 0.0
        for proc in (root, *root.children(recursive=True)):
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:  # ended between the listing and the read: counted by its parent once reaped
                continue
        return total

    def snapshot(self) -> dict[str, float]:
        import psutil

        parts = dict.fromkeys(CPU_PARTS, 0.0)
        me = psutil.Process()
        t = me.cpu_times()
        parts["bench"] = t.user + t.system
        parts["ended"] = t.children_user + t.children_system
        for child in me.children():
            try:
                cmdline = " ".join(child.cmdline())
                part = ("broker" if "kafka.Kafka" in cmdline else "spark" if "org.apache.spark" in cmdline else "ended")
                parts[part] += self._tree_seconds(child)
            except psutil.Error:
                continue
        if self.postmaster is not None:
            try:
                parts["postgres"] = self._tree_seconds(self.postmaster)
            except psutil.Error:
                pass
        parts["ours"] = sum(parts[k] for k in ("broker", "spark", "postgres", "bench", "ended"))
        m = psutil.cpu_times()
        # Busy = user + nice + system + irq + softirq (Linux counts guest time inside user already).
        parts["machine"] = sum(getattr(m, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
        return parts

    def measure(self) -> "CpuSpan":
        return CpuSpan(self)


class CpuSpan:
    """``with meter.measure() as cpu:`` ... then ``cpu.seconds`` by part, and the wall."""

    def __init__(self, meter: CpuMeter):
        self.meter = meter
        self.seconds: dict[str, float] = {}

    def __enter__(self) -> "CpuSpan":
        self._before = self.meter.snapshot()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._started
        after = self.meter.snapshot()
        self.seconds = {k: after[k] - self._before[k] for k in CPU_PARTS}
        self.seconds["wall"] = wall


def mean_cpu(spans: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.fmean(s[k] for s in spans) for k in spans[0]}



def median_run(runs: list[dict], key: str) -> dict:
    """The run whose ``key`` is the median (the lower middle of an even count),
    with every run's ``key`` alongside, in the order they ran."""
    ordered = sorted(runs, key=lambda run: run[key])
    return {**ordered[(len(runs) - 1) // 2], "runs": [run[key] for run in runs]}
