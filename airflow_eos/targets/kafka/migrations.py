"""The Kafka target's own tables in the ledger (schema ``eos``), on its own
track of versions (core/migrations.py's ``TargetMigration``), applied by
``Ledger.migrate``. Both steps shipped as the core's migrations 8 and 12
before targets had tracks of their own: they are applied in those places of
the core's sequence, and a ledger at core version 12 has them.
"""

from __future__ import annotations

from airflow_eos.core.migrations import TargetMigration

MIGRATIONS: tuple[TargetMigration, ...] = (
    TargetMigration(
        1,
        """
        -- The Kafka target: the window's committed Kafka transaction, by its
        -- commit token (epoch << 32 | random bits), which every record of the
        -- transaction carries as its eos-commit header and the window's marker
        -- consumer group holds as an offset. verify counts a record only if
        -- its token is here (the embedded broker shows aborted records to
        -- read_committed readers). Written in the transaction that marks the
        -- window committed.
        CREATE TABLE eos.kafka_commits (
            pipeline          text        NOT NULL,
            window_start      timestamptz NOT NULL,
            target            text        NOT NULL,  -- kafka:<kafka_conn_id>/<topic>
            epoch             integer     NOT NULL,
            token             bigint      NOT NULL,
            transactional_id  text        NOT NULL,
            marker_group      text        NOT NULL,
            records           bigint,  -- produced by the transaction (null: recorded from the marker)
            committed_at      timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, window_start),
            FOREIGN KEY (pipeline, window_start, epoch) REFERENCES eos.attempts ON DELETE CASCADE
        );
        """,
        shipped_as=8,
    ),
    TargetMigration(
        2,
        """
        -- The Kafka target's commit intents: written on a connection of their own
        -- (autocommit) before a window's Kafka transaction begins, so that a commit
        -- that died after it can be told apart from one that never committed when
        -- the window's marker (consumer-group offsets) expired. topic_ends: the
        -- target topic's end offset per partition then ({"0": 17, ...}): every
        -- record of the transaction lies at or after it. resolution: null while
        -- nobody knows (see targets/kafka/intent.py). No foreign key: the commit's
        -- own transaction holds the attempt row FOR UPDATE while this is written.
        CREATE TABLE eos.kafka_intents (
            pipeline          text        NOT NULL,
            window_start      timestamptz NOT NULL,
            target            text        NOT NULL,
            epoch             integer     NOT NULL,
            token             bigint      NOT NULL,
            transactional_id  text        NOT NULL,
            marker_group      text        NOT NULL,
            topic_ends        jsonb       NOT NULL,
            records           bigint      NOT NULL,
            created_at        timestamptz NOT NULL DEFAULT now(),
            resolution        text        CHECK (resolution IN ('committed', 'aborted')),
            resolved_how      text,
            resolved_at       timestamptz,
            PRIMARY KEY (pipeline, window_start, token)
        );
        """,
        shipped_as=12,
    ),
)
