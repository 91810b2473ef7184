-- The Kafka topic id (KIP-516) of the record each dead letter stands for.
-- A topic deleted and recreated under the same name starts its offsets
-- again from 0, so (group, topic, partition, offset) names a record only
-- with the topic id: a poison record of the new topic at an offset that
-- had a dead letter under the old one is a record of its own, with a row
-- of its own. Without the id in the key, the old row absorbed the new
-- record's insert (ON CONFLICT DO NOTHING) and stood for it when a re-read
-- asked whether its dead letters were recorded: it was neither applied nor
-- dead-lettered.
--
-- NULL is an id of its own here (NULLS NOT DISTINCT): rows written before
-- this migration, or when the brokers' topic ids were unknown, match only
-- records whose id is unknown too. They shadow no record of a known topic
-- id; the cost is that such a record read again with its id known (a
-- replay after this upgrade) gets a second row, with the id, once — a dead
-- letter said twice, never one lost. No backfill: which incarnation of the
-- topic an old row came from cannot be told from what is stored.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS topic_id uuid;
ALTER TABLE dead_letters DROP CONSTRAINT IF EXISTS dead_letters_consumer_group_topic_partition_offset_key;
CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_record
    ON dead_letters (consumer_group, topic, partition, "offset", topic_id) NULLS NOT DISTINCT;
