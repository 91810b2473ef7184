-- orders: the producer's business row, one per client action (Idempotency-Key).
CREATE TABLE IF NOT EXISTS orders (
    id         bigserial   PRIMARY KEY,
    event_id   uuid        NOT NULL UNIQUE,
    user_id    bigint      NOT NULL,
    items      jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- outbox: events to publish, written in the same transaction as the order.
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
