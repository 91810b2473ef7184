-- A relay claims rows with a lease instead of holding row locks while it
-- produces: a row is the relay's until lease_until, and another relay takes
-- it over once the lease has run out (its relay died).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease_until timestamptz;

-- A row the broker refuses (too large, an invalid record) is marked failed
-- with the broker's reason, and no relay tries it again.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS failed_at timestamptz;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS fail_reason text;

DROP INDEX IF EXISTS outbox_unpublished;
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (id) WHERE published_at IS NULL AND failed_at IS NULL;
