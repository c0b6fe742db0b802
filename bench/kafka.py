"""The Kafka target (issue 19): the same window as the headline, published into
the topic ``orders_curated`` by ``KafkaTarget`` through ``dag.test`` of
dags/orders_to_topic.py on the same warm Spark Connect server, and this
target's ceiling: a transactional confluent-kafka producer producing the same
records (key, value, headers as the target writes them, built here the way
the example transform and the commit build them) into a fresh topic in one
transaction, with the target's producer settings; no ledger, no staging.

The two run ``repeats`` times, interleaved (window, produce, window, ...):
each window into a fresh target topic (created here: the target never
creates one) with a ledger database of its own, its marker group deleted
first (the same window again would otherwise be found committed by the
marker of the run before); the median of each is reported. Every run is
checked by a ``read_committed`` read of the topic: among the records of the
commit token the ledger records, exactly the window's records, once each
(by their ``eos-topic`` / ``eos-partition`` / ``eos-offset`` headers);
the ceiling's topic, the same number of distinct source records.
Also the section of results.md that shows them (§2d)."""

from __future__ import annotations

import time

from measure import checkpoint, median_run
from records import HOUR, PARTITIONS, T0, TOPIC, biggest_window
from windows import run_exactly_once

DAG_ID = "orders_to_topic"
CEILING_TOPIC = "bench_produce_ceiling"
CEILING_PIPELINE = "bench_produce_ceiling"


def target_spec(dag):
    """The KafkaTarget of the example DAG (its commit task's)."""
    return next(t.target for t in dag.tasks if getattr(t, "target", None) is not None)


def fresh_target_topic(admin, topic: str) -> None:
    """``topic`` deleted (if there) and created empty, with the source's partitions."""
    from confluent_kafka.admin import NewTopic

    for f in admin.delete_topics([topic]).values():
        try:
            f.result(15)
        except Exception:  # noqa: BLE001 - it did not exist
            pass
    time.sleep(0.5)
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(15)


def forget_marker(admin, spec) -> None:
    """Delete the window's marker group: each run is the same window, into a
    fresh ledger; the marker of the run before would tell its commit that the
    window committed already (as it must, in production)."""
    from airflow_eos.core.windows import Window
    from airflow_eos.targets.kafka import client

    group = client.marker_group(spec.transactional_id_prefix, spec.target_id, Window(DAG_ID, T0, T0 + HOUR))
    for f in admin.delete_consumer_groups([group], request_timeout=15).values():
        try:
            f.result()
        except Exception:  # noqa: BLE001 - no such group (the first run)
            pass


def read_lineage(bootstrap: str, topic: str, token: int | None, timeout: float = 300.0) -> tuple[int, set]:
    """A ``read_committed`` read of ``topic`` from its start to the end of
    each partition (EOF, never the high watermark):
    how many records carry commit token ``token`` (every record if None),
    and their distinct (source partition, offset)."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaTP

    from airflow_eos.targets.kafka import client

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-read-{topic}-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
    wanted = None if token is None else str(token).encode()
    count, lineage = 0, set()
    try:
        consumer.assign([KafkaTP(topic, p, 0) for p in range(PARTITIONS)])
        pending = set(range(PARTITIONS))
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} took over {timeout:.0f}s (partitions {sorted(pending)} open)")
            for msg in consumer.consume(10_000, 0.5):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(f"cannot read {topic}: {msg.error().str()}")
                headers = dict(msg.headers() or ())
                if wanted is not None and headers.get(client.H_COMMIT) != wanted:
                    continue
                if headers.get(client.H_TOPIC) != TOPIC.encode():
                    raise RuntimeError(f"{topic}[{msg.partition()}]@{msg.offset()}: not a record of {TOPIC}")
                count += 1
                lineage.add((int(headers[client.H_PARTITION]), int(headers[client.H_OFFSET])))
    finally:
        consumer.close()
    return count, lineage


def check_window(bootstrap: str, topic: str, token: int | None, ends: dict[int, int], what: str) -> int:
    """The records of ``token`` in ``topic`` are exactly the window's, once each: their number."""
    count, lineage = read_lineage(bootstrap, topic, token)
    if count != len(lineage):
        raise RuntimeError(f"{what}: {count - len(lineage)} source record(s) published more than once")
    outside = [(p, o) for p, o in lineage if not 0 <= o < ends.get(p, 0)]
    if outside:
        raise RuntimeError(f"{what}: {len(outside)} record(s) from outside the window, e.g. {outside[:3]}")
    return count


def committed_token(url: str) -> int:
    """The commit token of the window's transaction, as the run's ledger records it."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT token FROM eos.kafka_commits WHERE pipeline = %s", (DAG_ID,)).fetchall()
    if len(rows) != 1:
        raise RuntimeError(f"the ledger records {len(rows)} commit(s) of the window, expected 1")
    return int(rows[0][0])


def published_rows(bootstrap: str, topic: str, url: str, ends: dict[int, int]) -> int:
    """What run_exactly_once counts: the window's records the run published (see check_window)."""
    return check_window(bootstrap, topic, committed_token(url), ends, f"the window published into {topic}")


# --------------------------------------------------------------------------- the ceiling


def ceiling_records(ends: dict[int, int], spec, token: int) -> list[tuple[bytes, bytes, list]]:
    """The window's records as the target publishes them: the example
    transform's key (order id) and value (the order as compact JSON, amount
    as text), the ``customer`` header, the commit's lineage headers. Built
    here (records.order_value's fields), not timed."""
    from airflow_eos.targets.kafka import client

    fixed = [(client.H_PIPELINE, CEILING_PIPELINE.encode()), (client.H_WINDOW_START, T0.isoformat().encode()),
             (client.H_WINDOW_END, (T0 + HOUR).isoformat().encode()), (client.H_EPOCH, b"1"),
             (client.H_COMMIT, str(token).encode())]
    # The headers that repeat are shared objects: 1M records stay well under 1 GB.
    by_partition = [fixed + [(client.H_TOPIC, TOPIC.encode()), (client.H_PARTITION, b"%d" % p)]
                    for p in range(PARTITIONS)]
    customers = [("customer", b"c-%05d" % c) for c in range(10_007)]
    out = []
    for i in range(sum(ends.values())):
        order, customer = b"o-%09d" % i, customers[i % 10_007]
        value = b'{"order_id":"%s","customer":"%s","amount":"%d.%02d"}' % (order, customer[1], (i * 37) % 100_000,
                                                                           i % 100)
        headers = [*by_partition[i % PARTITIONS], (client.H_OFFSET, b"%d" % (i // PARTITIONS)), customer]
        out.append((order, value, headers))
    return out


def produce_ceiling(bench, records: list, spec, token: int, size: int, ends: dict[int, int]) -> dict:
    """One transaction of a transactional producer with the target's producer
    settings (client.producer: the commit's): init, begin, produce every
    record, flush, commit. Timed from the producer's creation to the commit;
    the topic read back afterwards."""
    from airflow_eos.targets.kafka import client

    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None and len(errors) < 5:
            errors.append(err.str())

    fresh_target_topic(bench.admin, CEILING_TOPIC)
    with bench.meter.measure() as cpu:
        producer = client.producer({"bootstrap.servers": bench.bootstrap}, f"bench-ceiling-{time.monotonic_ns()}",
                                   {**spec.producer_config, "on_delivery": delivered,
                                    "delivery.report.only.error": True})
        producer.init_transactions(client.TIMEOUT)
        producer.begin_transaction()
        produce = producer.produce
        for key, value, headers in records:
            while True:
                try:
                    produce(CEILING_TOPIC, value=value, key=key, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(client.TIMEOUT) or errors:
            raise RuntimeError(f"the produce ceiling did not deliver: {errors}")
        producer.commit_transaction(client.TIMEOUT)
    written = check_window(bench.bootstrap, CEILING_TOPIC, token, ends, "the produce ceiling")
    if written != size:
        raise RuntimeError(f"the produce ceiling wrote {written} records, expected {size}")
    seconds = cpu.seconds["wall"]
    return {"seconds": seconds, "records_per_s": size / seconds, "cpu_s": cpu.seconds}


def measure_kafka(bench, size: int, ends: dict[int, int], urls: dict[str, str], run_after) -> dict:
    """§2d of one size: the Kafka target's window and the produce ceiling,
    ``bench.repeats`` times interleaved."""
    dag = bench.dags[DAG_ID]
    spec = target_spec(dag)
    token = 1 << 32 | 1
    records = ceiling_records(ends, spec, token)
    windows, produces = [], []
    try:
        for j in range(bench.repeats):
            fresh_target_topic(bench.admin, spec.topic)  # each window into a fresh topic, as into a fresh ledger
            forget_marker(bench.admin, spec)
            checkpoint(bench.pg_url)
            url = urls[f"kafka_{j}"]
            windows.append(run_exactly_once(dag, size, url, run_after + j * HOUR / 16, bench.connect_conn,
                                            lambda: published_rows(bench.bootstrap, spec.topic, url, ends),
                                            bench.meter))
            produces.append(produce_ceiling(bench, records, spec, token, size, ends))
            print(f"   run {j + 1}/{bench.repeats}: kafka window {windows[-1]['window_s']:.2f}s, "
                  f"phases { {k: round(v, 2) for k, v in windows[-1]['phases_s'].items()} }, "
                  f"commit {windows[-1]['commit_core_s']:.2f}s; "
                  f"produce ceiling {produces[-1]['seconds']:.2f}s", flush=True)
    finally:
        for f in bench.admin.delete_topics([spec.topic, CEILING_TOPIC]).values():
            try:
                f.result(15)
            except Exception:  # noqa: BLE001 - not created (a run failed before)
                pass
    return {"exactly_once_kafka": median_run(windows, "window_s"), "ceiling_produce": median_run(produces, "seconds")}


def kafka_ratios(r: dict) -> dict:
    """One size's Kafka-target figures against its ceiling and the PostgreSQL window (§2)."""
    window, ceiling, pg = r["exactly_once_kafka"], r["ceiling_produce"], r["exactly_once"]
    return {
        "kafka_window_s": window["window_s"],
        "produce_ceiling_s": ceiling["seconds"],
        # As e2e_over_ceiling: the window's records/s over the ceiling's.
        "kafka_over_produce_ceiling": ceiling["seconds"] / window["window_s"],
        "kafka_commit_share": window["phases_s"]["commit"] / window["window_s"],
        "kafka_commit_over_produce_ceiling": window["commit_core_s"] / ceiling["seconds"],
        "kafka_window_over_postgres_window": window["window_s"] / pg["window_s"],
    }


def kafka_headline(results: dict) -> dict:
    """results.json's top-level Kafka-target figures, of the biggest window."""
    big = biggest_window(results)
    if "kafka_window_s" not in big:
        return {}
    return {"kafka_window_1m_seconds": big["kafka_window_s"],
            "kafka_over_produce_ceiling_1m": big["kafka_over_produce_ceiling"],
            "kafka_commit_1m_seconds": big["exactly_once_kafka"]["commit_core_s"],
            "produce_ceiling_1m_seconds": big["produce_ceiling_s"]}


# --------------------------------------------------------------------------- results.md §2d


def kafka_section(res: dict) -> str:
    """§2d, when the run measured the Kafka target (an older results.json did not)."""
    from report import _rate, _runs, _secs, _share, _table

    if not any("exactly_once_kafka" in r for r in res["sizes"].values()):
        return ""
    head, row = _table(res)

    def k(r):
        return r["exactly_once_kafka"]

    def c(r):
        return r["ceiling_produce"]

    def phase(name):
        return lambda r: _share(k(r), k(r)["phases_s"][name])

    return "".join([
        "\n## 2d. The Kafka target: the same window into a topic (dags/orders_to_topic.py, same server)\n\n",
        "The window of §2 published by `KafkaTarget` (ledger in PostgreSQL, one database per run) into a fresh "
        f"`orders_curated` topic of {PARTITIONS} partitions (created by the bench: the target never creates one): "
        "the stage job stages the example transform's records (key: the order id, value: the order as compact "
        "JSON, header: the customer) into the PostgreSQL staging table, the commit task runs the whole Kafka "
        "transaction — `init_transactions` (fencing), every staged row produced with its lineage headers from "
        "a server-side cursor, the window's marker offsets, `commit_transaction` — then the ledger. Run through "
        "`dag.test` on the same warm Spark Connect server as §2, interleaved with the ceiling, `--repeats` times "
        "(the median run of each). Each run is checked by a `read_committed` read of the topic: among the "
        "records of the commit token the ledger records, exactly the window's records, once each (by their "
        "`eos-topic` / `eos-partition` / `eos-offset` headers). The ceiling is a transactional confluent-kafka "
        "producer with the target's producer settings (`linger.ms` 20, `batch.num.messages` 10000, "
        "idempotent, `acks=all`, no compression: the commit's own) producing the same records (the same key, "
        "value and headers, built beforehand in Python) into a fresh topic in one transaction; no ledger, "
        "staging, Spark or marker (timed from the producer's creation to the commit's end; read back after).\n\n",
        head,
        row("window time, plan start → commit end (the median run)", lambda r: _secs(k(r)["window_s"])),
        row("… every run, in order", lambda r: _runs(k(r)["runs"])),
        row("records/s", lambda r: _rate(k(r)["records_per_s"])),
        row("plan task", phase("plan")),
        row("stage task", phase("stage")),
        row("… of which Spark job (read + transform + stage + checkpoint)",
            lambda r: _share(k(r), k(r)["stage_job_s"]["job"])),
        row("await_checkpoint task", phase("await_checkpoint")),
        row("commit task", phase("commit")),
        row("… of which the commit (Kafka transaction + ledger, core)", lambda r: _share(k(r), k(r)["commit_core_s"])),
        row("Airflow between tasks", lambda r: _share(k(r), k(r)["airflow_gaps_s"])),
        row("produce ceiling: one transaction of the same records (the median run)", lambda r: _secs(c(r)["seconds"])),
        row("… every run, in order (interleaved with the windows)", lambda r: _runs(c(r)["runs"])),
        row("… records/s", lambda r: _rate(c(r)["records_per_s"])),
        row("commit (core) / produce ceiling (time)", lambda r: f"{r['kafka_commit_over_produce_ceiling']:.2f}×"),
        row("PostgreSQL window (§2, partition attach), for comparison", lambda r: _secs(r["exactly_once"]["window_s"])),
        row("**Kafka window / produce ceiling (records/s)**", lambda r: f"**{r['kafka_over_produce_ceiling']:.3f}**"),
        row("Kafka window time / PostgreSQL window time (§2)",
            lambda r: f"{r['kafka_window_over_postgres_window']:.2f}×"),
    ])
