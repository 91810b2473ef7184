-- Fencing by epoch: a partition's new owner takes epoch + 1 on assignment
-- (Writer.Take), and every batch's compare-and-set checks the epoch as
-- well as the offset, so a zombie is fenced on its first write even before
-- the new owner has written. A row taken but never written has no offset.
ALTER TABLE sink_offsets ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE sink_offsets ALTER COLUMN next_offset DROP NOT NULL;

-- The dead-letter topic is fed from this table, asynchronously and at
-- least once: published_at is set once the copy is on the topic;
-- publish_after leases a row to one publisher at a time; publish_note says
-- how it was published (e.g. without its value, which the broker refused).
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS published_at  timestamptz;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS publish_after timestamptz;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS publish_note  text;
CREATE INDEX IF NOT EXISTS dead_letters_unpublished ON dead_letters (consumer_group, id) WHERE published_at IS NULL;
-- Rows written before this migration were published synchronously.
UPDATE dead_letters SET published_at = created_at WHERE published_at IS NULL;
