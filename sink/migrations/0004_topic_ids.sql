-- The Kafka topic id (KIP-516) the stored offset belongs to. A topic
-- deleted and recreated under the same name gets a new id, and its offsets
-- start again from 0: an offset stored for the old topic means nothing in
-- the new one, even when the new log has grown past it. Written with each
-- batch's offset; NULL for rows from before, or brokers without topic ids.
ALTER TABLE sink_offsets ADD COLUMN IF NOT EXISTS topic_id uuid;
