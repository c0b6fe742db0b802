"""The Avro source (issue 40): a window of Avro records in Confluent's wire
format (dags/orders_hourly_avro.py: ``KafkaSource(value_format="avro")``, the
reader schema frozen with the plan, writer schemas resolved by id in a real
schema registry, Apicurio Registry started by the bench) beside the JSON window
of §2a (dags/orders_hourly.py, the same publishing mode: replace_window), both
on the same warm Spark Connect server into PostgreSQL, ``repeats`` times
interleaved (Avro window, JSON window, ...), each in a database of its own.

The Avro topic holds as many records as the JSON one, round-robin over the
same partitions with the same timestamps: orders of the example's two writer
schemas in turn (tests/harness/avro.py: V1 ``{id, amount}``, V2 adding
``note``; written by confluent-kafka's AvroSerializer, as a producer writes
them), all decodable, so the window publishes every record. Beside them, the
decode ceiling: the decoder the read tasks run (core.avro.AvroDecoder, writer
schemas cached) over the same values in this process, in core-seconds. Also
the section of results.md that shows them (§2h)."""

from __future__ import annotations

import json
import os
import sys

from measure import checkpoint, median_run
from records import HOUR, REPO, biggest_window, fresh_topic
from windows import run_exactly_once

# harness.avro: the example's schemas and the serializer the tests write Avro with
if str(REPO / "tests") not in sys.path:
    sys.path.append(str(REPO / "tests"))

DAG_ID = "orders_hourly_avro"
TOPIC = "orders_avro"  # the example DAG's topic
TABLE = "analytics.orders_avro"


def avro_values(registry_url: str):
    """``value(i)``: order i in Avro of writer schema V1 (even i) or V2 (odd i),
    the subject ``orders_avro-value`` holding V1 then V2 (V2 the reader schema)."""
    from harness.avro import V1, V2, order, register, serializer

    register(registry_url, f"{TOPIC}-value", V1)
    register(registry_url, f"{TOPIC}-value", V2)
    writers = ((V1, serializer(registry_url, V1)), (V2, serializer(registry_url, V2)))

    def value(i: int) -> bytes:
        schema, write = writers[i % 2]
        return write(order(i, schema), TOPIC)

    return value


def fresh_avro_topic(bench, registry_url: str, size: int) -> tuple[dict[int, int], float]:
    """The Avro topic again with ``size`` orders: each partition's window end offset, the seconds producing took."""
    return fresh_topic(bench, size, TOPIC, value=avro_values(registry_url))


def decode_ceiling(registry_url: str, size: int, meter) -> dict:
    """The read tasks' decoder over ``size`` of the topic's values (made here,
    untimed), in this process: records/s and core-seconds."""
    from airflow_eos.core.avro import AvroDecoder, registry_lookup
    from harness.avro import V2, client

    value = avro_values(registry_url)
    values = [value(i) for i in range(size)]
    decoder = AvroDecoder(json.dumps(V2), registry_lookup(client(registry_url)))
    with meter.measure() as cpu:
        failed = sum(decoder.decode(v).error is not None for v in values)
    if failed:
        raise RuntimeError(f"{failed} of the bench's Avro values did not decode")
    seconds = cpu.seconds["wall"]
    return {"seconds": seconds, "records_per_s": size / seconds, "core_s": cpu.seconds["bench"],
            "cpu_s": cpu.seconds}


def measure_avro(bench, size: int, urls: dict[str, str], run_after, registry_url: str) -> dict:
    """§2h of one size: the Avro window and the JSON window, ``bench.repeats``
    times interleaved, each in a database of its own; the decode ceiling once.
    The JSON topic (run.py's fresh_topic) holds the size's records already."""
    os.environ["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"] = json.dumps(
        {"conn_type": "eos_schema_registry", "host": registry_url})
    _, produce_s = fresh_avro_topic(bench, registry_url, size)
    avro_runs, json_runs = [], []
    for j in range(bench.repeats):
        repeat_after = run_after + j * HOUR / 16
        checkpoint(bench.pg_url)
        avro_runs.append(run_exactly_once(bench.dags[DAG_ID], size, urls[f"avro_{j}"], repeat_after,
                                          bench.connect_conn, TABLE, bench.meter))
        checkpoint(bench.pg_url)
        json_runs.append(run_exactly_once(bench.dags["orders_hourly"], size, urls[f"avro_json_{j}"], repeat_after,
                                          bench.connect_conn, "analytics.orders", bench.meter))
        print(f"   run {j + 1}/{bench.repeats}: Avro window {avro_runs[-1]['window_s']:.2f}s "
              f"({avro_runs[-1]['cpu_s']['ours']:.1f} core-s), JSON window {json_runs[-1]['window_s']:.2f}s "
              f"({json_runs[-1]['cpu_s']['ours']:.1f} core-s)", flush=True)
    return {"avro_produce_s": produce_s, "exactly_once_avro": median_run(avro_runs, "window_s"),
            "exactly_once_avro_json": median_run(json_runs, "window_s"),
            "ceiling_avro_decode": decode_ceiling(registry_url, size, bench.meter)}


def avro_ratios(r: dict) -> dict:
    """One size's Avro figures against the JSON window's, in time and in core-seconds."""
    avro, plain = r["exactly_once_avro"], r["exactly_once_avro_json"]
    return {
        "avro_window_s": avro["window_s"],
        "avro_over_json_window": plain["window_s"] / avro["window_s"],  # records/s over records/s
        "avro_core_s_over_json": avro["cpu_s"]["ours"] / plain["cpu_s"]["ours"],
        "avro_decode_core_s_per_1m": r["ceiling_avro_decode"]["core_s"] * 1e6 / avro["records"],
    }


def avro_headline(results: dict) -> dict:
    """results.json's top-level Avro figures, of the biggest window."""
    big = biggest_window(results)
    if "avro_window_s" not in big:
        return {}
    return {"avro_window_1m_seconds": big["avro_window_s"], "avro_over_json_window_1m": big["avro_over_json_window"],
            "avro_core_s_over_json_1m": big["avro_core_s_over_json"]}


# --------------------------------------------------------------------------- results.md §2h


def avro_section(res: dict) -> str:
    """§2h, when the run measured the Avro source (an older results.json did not)."""
    from report import _rate, _runs, _secs, _share, _table

    if not any("exactly_once_avro" in r for r in res["sizes"].values()):
        return ""
    head, row = _table(res)

    def a(r):
        return r["exactly_once_avro"]

    def j(r):
        return r["exactly_once_avro_json"]

    return "".join([
        "\n## 2h. An Avro source: the same window of Avro records (dags/orders_hourly_avro.py, same server)\n\n",
        "The window of §2a with its values in Avro (Confluent's wire format: the example's two writer schemas in "
        "turn, 14-23 B a value where the JSON orders are ~100 B) read by `KafkaSource(value_format=\"avro\")`: "
        "the plan freezes the subject's latest schema as the reader schema, the read tasks resolve each writer "
        "schema once in the schema registry (Apicurio Registry, in memory) and decode every value in Python "
        "(fastavro, Avro's resolution rules), the transform receives the decoded columns; published by "
        "INSERT … SELECT like §2a. Interleaved with the JSON window of §2a, `--repeats` times, each in a "
        "database of its own (the median run of each). Core-seconds: broker, Spark, PostgreSQL and this "
        "process, summed over the run. The decode ceiling is the read tasks' decoder over the same values in "
        "one process, writer schemas cached.\n\n",
        head,
        row("Avro window, plan start → commit end (the median run)", lambda r: _secs(a(r)["window_s"])),
        row("… every run, in order", lambda r: _runs(a(r)["runs"])),
        row("… records/s", lambda r: _rate(a(r)["records_per_s"])),
        row("… stage task", lambda r: _share(a(r), a(r)["phases_s"]["stage"])),
        row("… core-seconds", lambda r: f"{a(r)['cpu_s']['ours']:.1f}"),
        row("JSON window (§2a's DAG, interleaved; the median run)", lambda r: _secs(j(r)["window_s"])),
        row("… every run, in order", lambda r: _runs(j(r)["runs"])),
        row("… core-seconds", lambda r: f"{j(r)['cpu_s']['ours']:.1f}"),
        row("decode ceiling: one process decoding the values (records/s)",
            lambda r: _rate(r["ceiling_avro_decode"]["records_per_s"])),
        row("… core-seconds per 1M records", lambda r: f"{r['avro_decode_core_s_per_1m']:.1f}"),
        row("**Avro window / JSON window (records/s)**", lambda r: f"**{r['avro_over_json_window']:.3f}**"),
        row("Avro window's core-seconds / JSON window's", lambda r: f"{r['avro_core_s_over_json']:.2f}"),
    ])
