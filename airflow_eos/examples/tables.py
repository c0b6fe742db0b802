"""The target tables of the example DAGs (airflow_eos.examples.transforms
fills them). The DAG files create them at parse time through these constants,
so this module imports nothing: parsing a DAG must not load pyspark.
"""

# The target tables of the examples. The sink never creates or alters a target.
#
# The lineage key's columns are listed integers first. A
# window's rows share their topic (and window start), so with the topic first
# every comparison of a sort or a B-tree descent compares equal texts before it
# reaches the offset: building the unique index on a 1M-row staging took
# 1.0-1.4 s that way and 0.46-0.50 s this way (same rows, PostgreSQL 15). The
# index still answers equality on all three columns, which is what lineage needs.
_ORDERS_COLUMNS = """
    order_id          text           NOT NULL,
    customer          text,
    amount            numeric(12, 2) NOT NULL,
    eos_topic         text           NOT NULL,
    eos_partition     integer        NOT NULL,
    eos_offset        bigint         NOT NULL,
    eos_pipeline      text           NOT NULL,
    eos_window_start  timestamptz    NOT NULL,"""

ORDERS_TABLE_DDL = f"""
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.orders ({_ORDERS_COLUMNS}
    -- lineage is unique: the database itself refuses a duplicate. Integers
    -- first: the topic's text is compared only on ties (see the note above).
    UNIQUE (eos_partition, eos_offset, eos_topic)
);
"""

# The same orders, one partition per window (mode partition_per_window): the
# commit attaches the window's staging as a partition instead of copying rows.
# A partitioned table's unique indexes must include its partition key.
PARTITIONED_ORDERS_TABLE_DDL = f"""
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.orders_partitioned ({_ORDERS_COLUMNS}
    UNIQUE (eos_partition, eos_offset, eos_topic, eos_window_start)
) PARTITION BY RANGE (eos_window_start);
"""

EVENTS_PER_MINUTE_TABLE_DDL = """
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.events_per_minute (
    minute            timestamptz NOT NULL,
    events            bigint      NOT NULL,
    eos_pipeline      text        NOT NULL,
    eos_window_start  timestamptz NOT NULL
);
"""

# The orders of an Avro topic (orders_hourly_avro): the reader schema's fields
# (id, amount, note), decoded from records of any compatible writer schema.
ORDERS_AVRO_TABLE_DDL = """
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.orders_avro (
    id                bigint         NOT NULL,
    amount            double precision NOT NULL,
    note              text,
    eos_topic         text           NOT NULL,
    eos_partition     integer        NOT NULL,
    eos_offset        bigint         NOT NULL,
    eos_pipeline      text           NOT NULL,
    eos_window_start  timestamptz    NOT NULL,
    UNIQUE (eos_partition, eos_offset, eos_topic)
);
"""
