-- Retention (dedup.retention): processed_events becomes a table partitioned
-- by slice, a span of claim time. Exactly one slice is current: claims
-- insert into it and look for their keys in the older ones (package dedup,
-- Claim). Slices past the horizon are dropped whole (dedup.Retention): no
-- long DELETE, no bloat, no vacuum of the rest. processed_events_slices
-- lists the live slices and when each became current; the highest is the
-- current one, and slice s ends when slice s+1 starts.
--
-- The table that existed becomes slice 0, its primary key rebuilt with the
-- slice (once, at this migration: on a large table it takes a while).
ALTER TABLE processed_events RENAME TO processed_events_s0;
ALTER TABLE processed_events_s0 ADD COLUMN slice integer NOT NULL DEFAULT 0;
ALTER TABLE processed_events_s0 DROP CONSTRAINT processed_events_pkey;
ALTER TABLE processed_events_s0 ADD CONSTRAINT processed_events_s0_pkey PRIMARY KEY (event_id, handler, slice);
ALTER TABLE processed_events_s0 ADD CONSTRAINT processed_events_s0_slice CHECK (slice = 0);

CREATE TABLE processed_events (
    event_id       uuid        NOT NULL,
    handler        text        NOT NULL,
    bus            text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    trace_id       text,
    payload_digest bytea,
    slice          integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (event_id, handler, slice)
) PARTITION BY LIST (slice);
ALTER TABLE processed_events ATTACH PARTITION processed_events_s0 FOR VALUES IN (0);
ALTER TABLE processed_events_s0 DROP CONSTRAINT processed_events_s0_slice;

CREATE TABLE processed_events_slices (
    slice      integer     PRIMARY KEY,
    started_at timestamptz NOT NULL
);
INSERT INTO processed_events_slices (slice, started_at)
SELECT 0, coalesce(min(processed_at), now()) FROM processed_events_s0;

-- Whoever could use the old table can use the new one: its privileges
-- (other than its owner's) are granted on the parent — which every new
-- slice copies (dedup.Retention) — and reading the slices on
-- processed_events_slices, which every claim reads.
DO $$
DECLARE g record;
BEGIN
    FOR g IN
        SELECT a.privilege_type AS privilege,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS grantee
        FROM pg_class c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = 'processed_events_s0'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON processed_events TO %s', g.privilege, g.grantee);
        EXECUTE format('GRANT SELECT ON processed_events_slices TO %s', g.grantee);
    END LOOP;
END $$;
