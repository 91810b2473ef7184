-- processed_events is the dedup truth: one row per (event, handler) applied.
CREATE TABLE IF NOT EXISTS processed_events (
    event_id     uuid        NOT NULL,
    handler      text        NOT NULL,
    bus          text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    trace_id     text,
    PRIMARY KEY (event_id, handler)
);

-- sink_offsets holds, per consumer group and partition, the next offset to
-- process. It is written in the same transaction as the effects, so it is
-- never behind or ahead of them; the processor resumes from it.
CREATE TABLE IF NOT EXISTS sink_offsets (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    next_offset    bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- dead_letters keeps every record that could not be decoded or applied,
-- with the reason, written in the transaction of the batch it came in.
CREATE TABLE IF NOT EXISTS dead_letters (
    id             bigserial   PRIMARY KEY,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    "offset"       bigint      NOT NULL,
    event_id       uuid,
    reason         text        NOT NULL,
    record_key     bytea,
    record_value   bytea,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer_group, topic, partition, "offset")
);
CREATE INDEX IF NOT EXISTS dead_letters_event_id ON dead_letters (event_id);
