-- orders: the producer's business row, one per client action
-- (Idempotency-Key), written by the seed's POST /events-outbox/{bus} in the
-- transaction that enqueues its event. Its own component (orders.producer),
-- so that whatever serves that endpoint has the table whichever handlers
-- consume the events. The orders component's 0002 creates the same table
-- for schemas migrated before; both are IF NOT EXISTS and agree.
CREATE TABLE IF NOT EXISTS orders (
    id         bigserial   PRIMARY KEY,
    event_id   uuid        NOT NULL UNIQUE,
    user_id    bigint      NOT NULL,
    items      jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
