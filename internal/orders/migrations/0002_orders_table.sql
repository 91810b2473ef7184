-- orders: the producer's business row, one per client action
-- (Idempotency-Key), written by the seed's POST /events-outbox/{bus} in the
-- transaction that enqueues its event. Schemas migrated before the orders
-- package owned it have it from the outbox's first migration.
CREATE TABLE IF NOT EXISTS orders (
    id         bigserial   PRIMARY KEY,
    event_id   uuid        NOT NULL UNIQUE,
    user_id    bigint      NOT NULL,
    items      jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
