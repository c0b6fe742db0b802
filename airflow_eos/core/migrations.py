"""Versioned schema of the ledger (schema ``eos`` in the target database).

Migrations are applied by the code itself (core/schema.py), in order, each
once; appending a new ``(version, sql)`` pair is the only way to change the
core's schema. A target kind's own tables change only by a step appended to its
``ledger_migrations`` (a :class:`TargetMigration`, below).
"""

from __future__ import annotations

from typing import NamedTuple

# (version, sql); sql None: the version shipped a target kind's tables, which
# its own migrations now hold (TargetMigration.shipped_as).
MIGRATIONS: list[tuple[int, str | None]] = [
    (
        1,
        """
        CREATE TABLE eos.pipelines (
            pipeline    text PRIMARY KEY,
            created_at  timestamptz NOT NULL DEFAULT now()
        );

        -- cut(pipeline, topic, partition, at): the first offset whose record
        -- timestamp is >= at. Written once, never updated (see plan.py).
        CREATE TABLE eos.cuts (
            pipeline    text        NOT NULL REFERENCES eos.pipelines,
            topic       text        NOT NULL,
            partition   integer     NOT NULL CHECK (partition >= 0),
            at          timestamptz NOT NULL,
            "offset"    bigint      NOT NULL CHECK ("offset" >= 0),
            how         text        NOT NULL,
            frozen_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, topic, partition, at)
        );

        CREATE TABLE eos.windows (
            pipeline          text        NOT NULL REFERENCES eos.pipelines,
            window_start      timestamptz NOT NULL,
            window_end        timestamptz NOT NULL,
            state             text        NOT NULL DEFAULT 'planned'
                              CHECK (state IN ('planned', 'committed')),
            -- the newest attempt's epoch; an attempt with a smaller one is fenced
            epoch             integer     NOT NULL DEFAULT 0,
            planned_at        timestamptz NOT NULL DEFAULT now(),
            committed_at      timestamptz,
            committed_epoch   integer,
            published_rows    bigint,
            dead_letter_rows  bigint,
            PRIMARY KEY (pipeline, window_start),
            UNIQUE (pipeline, window_end),
            CHECK (window_start < window_end)
        );

        CREATE TABLE eos.window_ranges (
            pipeline      text        NOT NULL,
            window_start  timestamptz NOT NULL,
            topic         text        NOT NULL,
            partition     integer     NOT NULL,
            start_offset  bigint      NOT NULL CHECK (start_offset >= 0),
            end_offset    bigint      NOT NULL,
            PRIMARY KEY (pipeline, window_start, topic, partition),
            FOREIGN KEY (pipeline, window_start) REFERENCES eos.windows ON DELETE CASCADE,
            CHECK (start_offset <= end_offset)
        );

        CREATE TABLE eos.attempts (
            pipeline           text        NOT NULL,
            window_start       timestamptz NOT NULL,
            epoch              integer     NOT NULL CHECK (epoch > 0),
            state              text        NOT NULL DEFAULT 'open'
                               CHECK (state IN ('open', 'checkpointed', 'prepared', 'committed', 'aborted')),
            staging_table      text        NOT NULL,
            opened_at          timestamptz NOT NULL DEFAULT now(),
            checkpointed_at    timestamptz,
            prepared_at        timestamptz,
            ended_at           timestamptz,
            row_count          bigint,
            dead_letter_count  bigint,
            checksum           text,
            reason             text,
            PRIMARY KEY (pipeline, window_start, epoch),
            FOREIGN KEY (pipeline, window_start) REFERENCES eos.windows ON DELETE CASCADE
        );
        CREATE INDEX attempts_open ON eos.attempts (opened_at)
            WHERE state IN ('open', 'checkpointed', 'prepared');

        -- what an attempt consumed, written with its checkpoint
        CREATE TABLE eos.checkpoint_ranges (
            pipeline      text        NOT NULL,
            window_start  timestamptz NOT NULL,
            epoch         integer     NOT NULL,
            topic         text        NOT NULL,
            partition     integer     NOT NULL,
            start_offset  bigint      NOT NULL,
            end_offset    bigint      NOT NULL,
            records       bigint      NOT NULL,
            PRIMARY KEY (pipeline, window_start, epoch, topic, partition),
            FOREIGN KEY (pipeline, window_start, epoch) REFERENCES eos.attempts ON DELETE CASCADE
        );

        -- next offset to consume: the end of the contiguous committed prefix
        CREATE TABLE eos.partition_offsets (
            pipeline    text        NOT NULL REFERENCES eos.pipelines,
            topic       text        NOT NULL,
            partition   integer     NOT NULL,
            "offset"    bigint      NOT NULL,
            updated_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, topic, partition)
        );
        """,
    ),
    (
        2,
        """
        -- Attempts' staging tables live here, named by the code (never by users).
        CREATE SCHEMA IF NOT EXISTS eos_staging;

        -- One row per chunk (one Spark task's transaction) the checkpoint counts.
        -- Rows staged by chunks not listed here (a failed or duplicated task) are
        -- never published.
        CREATE TABLE eos.checkpoint_chunks (
            pipeline      text        NOT NULL,
            window_start  timestamptz NOT NULL,
            epoch         integer     NOT NULL,
            chunk         bigint      NOT NULL,
            rows          bigint      NOT NULL CHECK (rows >= 0),
            dead_letters  bigint      NOT NULL CHECK (dead_letters >= 0),
            checksum      text        NOT NULL,
            PRIMARY KEY (pipeline, window_start, epoch, chunk),
            FOREIGN KEY (pipeline, window_start, epoch) REFERENCES eos.attempts ON DELETE CASCADE
        );

        -- Records the transform could not process, published with their window.
        CREATE TABLE eos.dead_letters (
            pipeline      text        NOT NULL,
            window_start  timestamptz NOT NULL,
            epoch         integer     NOT NULL,
            topic         text        NOT NULL,
            partition     integer     NOT NULL,
            "offset"      bigint      NOT NULL,
            error         text        NOT NULL,
            key           bytea,
            value         bytea,
            PRIMARY KEY (pipeline, window_start, topic, partition, "offset"),
            FOREIGN KEY (pipeline, window_start) REFERENCES eos.windows
        );
        """,
    ),
    (
        3,
        """
        -- What the read tasks of one run of an attempt's stage job read completely:
        -- one row per sub-range, written by the task after its last record (a
        -- retried or speculative task writes the same row again). The job commit
        -- assembles the checkpoint's consumed ranges from the rows of its run, so
        -- the offsets checkpointed are what was read, never a second read of Kafka.
        CREATE TABLE eos.read_ranges (
            pipeline      text             NOT NULL,
            window_start  timestamptz      NOT NULL,
            epoch         integer          NOT NULL,
            run           text             NOT NULL,  -- one stage job run of the attempt
            topic         text             NOT NULL,
            partition     integer          NOT NULL,
            start_offset  bigint           NOT NULL,
            end_offset    bigint           NOT NULL,
            records       bigint           NOT NULL,
            seconds       double precision NOT NULL,  -- the first report's read time, for the job's log
            read_at       timestamptz      NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, window_start, epoch, run, topic, partition, start_offset),
            FOREIGN KEY (pipeline, window_start, epoch) REFERENCES eos.attempts ON DELETE CASCADE,
            CHECK (start_offset <= end_offset AND records BETWEEN 0 AND end_offset - start_offset)
        );
        """,
    ),
    (
        4,
        """
        -- A sealed staging (partition_per_window: checked against its checkpoint,
        -- indexed, waiting to be attached) refuses every change: a write task
        -- still running after its job's commit, or a hand, cannot alter what the
        -- checkpoint counted, so prepare and commit need not count it again.
        CREATE FUNCTION eos.refuse_change_to_sealed_staging() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'staging %.% is sealed: it holds exactly its attempt''s checkpoint until it is '
                            'published or dropped', TG_TABLE_SCHEMA, TG_TABLE_NAME;
        END
        $$;
        """,
    ),
    (
        5,
        """
        -- Who a pipeline belongs to: the DAG that plans it, the topics it reads and
        -- the target it publishes into (an opaque identity string the target
        -- gives, e.g. 'postgresql:analytics.orders'). The first plan claims it;
        -- every later plan must match (see core/ownership.py). topics IS NULL: not
        -- claimed yet (a pipeline planned before this migration, or released),
        -- so the next plan claims it. dag_id and target may stay NULL after the
        -- claim when the plans so far named none; the first plan that names one
        -- fills it in.
        ALTER TABLE eos.pipelines
            ADD COLUMN dag_id           text,
            ADD COLUMN topics           text[],
            ADD COLUMN target           text,
            -- the target holds one pipeline only (partition_per_window)
            ADD COLUMN target_exclusive boolean NOT NULL DEFAULT false,
            ADD COLUMN claimed_at       timestamptz,
            ADD CONSTRAINT pipelines_claim_has_topics
                CHECK (topics IS NOT NULL OR (dag_id IS NULL AND target IS NULL AND claimed_at IS NULL));
        -- a new claim looks for the other pipelines publishing into its target
        CREATE INDEX pipelines_target ON eos.pipelines (target) WHERE target IS NOT NULL;
        """,
    ),
    (
        6,
        """
        -- Which values of one staging column the column's type cannot take: a
        -- refused COPY names one value; this names all of a chunk's at once, so
        -- isolating refused rows costs a round trip per refused column, not a
        -- failed COPY per refused row. Values go through the column's input
        -- function with its typmod, as COPY does (a cast would cut a varchar
        -- short instead), nulls not at all (as in COPY). PostgreSQL 15 has no
        -- pg_input_is_valid: a block of 1,000 values is tried in one statement
        -- (~1.5 us a value, building the block included), and only a refused
        -- block value by value, each in a subtransaction (~12-16 us a value).
        CREATE FUNCTION eos.refused_inputs(staging regclass, col name, input text[])
        RETURNS TABLE (ordinal integer, error text) LANGUAGE plpgsql AS $$
        DECLARE
            fn text;
            args text;
            one text;
            many text;
            n integer := coalesce(array_length(input, 1), 0);
            lo integer := 1;
            hi integer;
            block text[];
        BEGIN
            SELECT t.typinput::regproc::text,
                   CASE WHEN p.pronargs = 3 THEN format(', %s::oid, %s',
                       CASE WHEN t.typelem <> 0 THEN t.typelem ELSE t.oid END, a.atttypmod) ELSE '' END
              INTO STRICT fn, args
              FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid JOIN pg_proc p ON p.oid = t.typinput
             WHERE a.attrelid = staging AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
            one := format('SELECT %s($1::cstring%s)', fn, args);
            many := format('SELECT count(%s(v::cstring%s)) FROM unnest($1) v', fn, args);
            WHILE lo <= n LOOP
                hi := least(lo + 999, n);
                block := '{}';
                FOR i IN lo .. hi LOOP
                    IF input[i] IS NOT NULL THEN
                        block := block || input[i];
                    END IF;
                END LOOP;
                BEGIN
                    EXECUTE many USING block;
                    lo := hi + 1;
                    CONTINUE;
                EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
                    NULL;  -- a value of the block is refused: find which, one by one
                END;
                FOR i IN lo .. hi LOOP
                    CONTINUE WHEN input[i] IS NULL;
                    BEGIN
                        EXECUTE one USING input[i];
                    EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
                        ordinal := i;
                        error := SQLERRM;
                        RETURN NEXT;
                    END;
                END LOOP;
                lo := hi + 1;
            END LOOP;
        END
        $$;
        """,
    ),
    (
        7,
        """
        -- Targets without transactions of their own (files): what a checkpoint
        -- staged, file by file (path relative to the attempt's staging
        -- directory, size, rows from the Parquet footer), written by the seal in
        -- the checkpoint's transaction; prepare and commit check the files
        -- against it.
        CREATE TABLE eos.staged_files (
            pipeline      text        NOT NULL,
            window_start  timestamptz NOT NULL,
            epoch         integer     NOT NULL,
            path          text        NOT NULL,
            kind          text        NOT NULL CHECK (kind IN ('data', 'dead_letters')),
            chunk         bigint      NOT NULL,
            bytes         bigint      NOT NULL CHECK (bytes >= 0),
            rows          bigint      NOT NULL CHECK (rows >= 0),
            PRIMARY KEY (pipeline, window_start, epoch, path),
            FOREIGN KEY (pipeline, window_start, epoch) REFERENCES eos.attempts ON DELETE CASCADE
        );

        -- The commit of such a target is a two-phase commit: the ledger
        -- transaction that marks the window committed also records its
        -- publication as 'decided'; moving the files into place follows and
        -- marks it 'published'. A decided publication is finished by a retried
        -- commit, a later commit of the pipeline or the sweep; one whose window
        -- another attempt committed since (a replace) is 'superseded'.
        CREATE TABLE eos.publications (
            pipeline      text        NOT NULL,
            window_start  timestamptz NOT NULL,
            epoch         integer     NOT NULL,
            target        text        NOT NULL,  -- the target's identity, e.g. files:/data/orders
            location      text        NOT NULL,  -- where the window is published, e.g. its partition directory
            state         text        NOT NULL DEFAULT 'decided'
                          CHECK (state IN ('decided', 'published', 'superseded')),
            schema        text,  -- the published rows' schema, as the target writes it
            replaces      integer,  -- the epoch whose publication this one replaces
            decided_at    timestamptz NOT NULL DEFAULT now(),
            published_at  timestamptz,
            PRIMARY KEY (pipeline, window_start, epoch),
            FOREIGN KEY (pipeline, window_start, epoch) REFERENCES eos.attempts ON DELETE CASCADE
        );
        CREATE INDEX publications_decided ON eos.publications (target) WHERE state = 'decided';
        """,
    ),
    (8, None),
    (
        9,
        """
        -- The committed epoch whose commit step ran to its end (its commit
        -- task's Asset event is emitted as the task succeeds). A rerun of a
        -- committed window whose target skips reruns opens no attempt when the
        -- commit was announced; one that died after committing and before this
        -- stages and commits (skipped) as before, so its event is not lost.
        ALTER TABLE eos.windows ADD COLUMN announced_epoch integer;
        """,
    ),
    (
        10,
        """
        -- The last `airflow-eos verify` of each pipeline, as the command
        -- recorded it (verify itself only reads): what the window status page
        -- shows beside the windows. Totals are null where the audit is of
        -- counts, not lineage.
        CREATE TABLE eos.verify_runs (
            pipeline           text        PRIMARY KEY,
            verified_at        timestamptz NOT NULL DEFAULT now(),
            target             text        NOT NULL,
            clean              boolean     NOT NULL,
            committed_windows  integer     NOT NULL,
            kafka_records      bigint,
            published_rows     bigint      NOT NULL,
            dead_letters       bigint      NOT NULL,
            duplicates         bigint,
            missing            bigint,
            extra              bigint,
            violations         integer     NOT NULL
        );
        """,
    ),
    (
        11,
        """
        -- The physical thing a claim's target resolved to at plan time
        -- (Sink.claim_identity: a Kafka topic by its cluster's id, not by the
        -- connection id in `target`). Null for claims recorded before; the
        -- pipeline's next plan fills it in. Two claims share a target when
        -- their `target` or their `target_place` is equal.
        ALTER TABLE eos.pipelines ADD COLUMN target_place text;
        CREATE INDEX pipelines_target_place ON eos.pipelines (target_place) WHERE target_place IS NOT NULL;
        """,
    ),
    (12, None),
    (
        13,
        """
        -- An Avro source's reader schema (Avro JSON), frozen with the window's
        -- plan: every rerun of the window decodes its records the same way,
        -- whatever the schema registry holds by then. Null: raw values.
        ALTER TABLE eos.windows ADD COLUMN reader_schema text;
        """,
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]


class TargetMigration(NamedTuple):
    """One step of a target kind's own tables in the ledger (schema ``eos``),
    on the kind's own track of versions (1, 2, ...): ``Ledger.migrate``
    applies each once, in order, under the core's migration lock.

    ``shipped_as``: the core version this step shipped under before targets
    had tracks of their own; it is applied in that place of the core's
    sequence (so a ledger gets the same schema as it always did), and a
    ledger whose core version reached it has it. Steps without one come after
    every step with one and are recorded per kind (``eos.target_schema_version``)."""

    version: int
    sql: str
    shipped_as: int | None = None
