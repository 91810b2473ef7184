-- outbox: events to publish, written in the same transaction as the
-- business change they announce. (Before the outbox held no business, this
-- file also created the demo's orders table; that is the orders package's
-- own migration now, with IF NOT EXISTS, so schemas migrated either way
-- agree.)
CREATE TABLE IF NOT EXISTS outbox (
    id           bigserial   PRIMARY KEY,
    event_id     uuid        NOT NULL UNIQUE,
    bus          text        NOT NULL,
    topic        text        NOT NULL,
    payload      bytea       NOT NULL,
    traceparent  text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    publishes    integer     NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
