-- A conflicting duplicate (an event id seen again with another payload) is
-- caught by comparing digests: the claim stores the first 16 bytes of the
-- SHA-256 of the record value it applied. Rows written before this
-- migration have NULL: their duplicates are skipped as before, unchecked.
ALTER TABLE processed_events ADD COLUMN IF NOT EXISTS payload_digest bytea;

-- sink_replays records every rewind of a group by `onceflow replay`, one
-- row per partition: from where (the stored offset before) back to where,
-- and for a backfill the one handler it was for. audit reads it to say
-- which processed rows a backfill applied.
CREATE TABLE IF NOT EXISTS sink_replays (
    id             bigserial   PRIMARY KEY,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    from_offset    bigint,
    to_offset      bigint      NOT NULL,
    handler        text,
    forced         boolean     NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS sink_replays_group ON sink_replays (consumer_group, created_at);
