-- emailHandler: one row per confirmation email sent. No unique key on
-- purpose: a second email for the same event is a second row.
CREATE TABLE IF NOT EXISTS emails_sent (
    id       bigserial   PRIMARY KEY,
    event_id uuid        NOT NULL,
    user_id  bigint      NOT NULL,
    subject  text        NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS emails_sent_event_id ON emails_sent (event_id);

-- inventoryHandler: quantity reserved per item, added to.
CREATE TABLE IF NOT EXISTS inventory_reserved (
    item     text   PRIMARY KEY,
    reserved bigint NOT NULL
);

-- analyticsHandler: counters (orders, items), added to. Sharded by source
-- partition so that partition workers do not queue on one hot row; the
-- counter's value is the sum over shards.
CREATE TABLE IF NOT EXISTS analytics_counters (
    name  text    NOT NULL,
    shard integer NOT NULL,
    value bigint  NOT NULL,
    PRIMARY KEY (name, shard)
);

-- recommenderHandler: weight per (user, item), added to.
CREATE TABLE IF NOT EXISTS recommender_weights (
    user_id bigint NOT NULL,
    item    text   NOT NULL,
    weight  bigint NOT NULL,
    PRIMARY KEY (user_id, item)
);
