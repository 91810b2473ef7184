-- The relay holding a row's lease (a random id per relay): a relay renews
-- and releases only the leases it holds, so one whose lease ran out while
-- its Kafka client held the row (Postgres unreachable for longer than the
-- lease) does not release the lease another relay took over since.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease_owner uuid;
