-- Node reservations: exclusive placement rights over units of one node for an audience.
-- `lifecycle` stores what time cannot tell (granted, needs-review, cancelled); pending,
-- active and expired follow from the term and the clock.

CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE node_reservations (
    id                TEXT PRIMARY KEY,
    node_id           TEXT NOT NULL REFERENCES nodes (id),
    allowed_org_ids   TEXT NOT NULL,
    managing_org_ids  TEXT NOT NULL,
    starts_at         BIGINT NOT NULL,
    ends_at           BIGINT,
    lifecycle         TEXT NOT NULL CHECK (lifecycle IN ('granted', 'needs-review', 'cancelled')),
    topology_gen      BIGINT NOT NULL,
    contract_ref      TEXT,
    reason            TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);
CREATE INDEX node_reservations_node ON node_reservations (node_id);

-- One row per reserved unit. `claiming` is false once the reservation is cancelled.
-- Rule: two claiming rows never hold one unit for overlapping terms.
CREATE TABLE node_reservation_units (
    reservation_id  TEXT NOT NULL REFERENCES node_reservations (id),
    node_id         TEXT NOT NULL,
    unit_id         TEXT NOT NULL,
    position        BIGINT NOT NULL,
    starts_at       BIGINT NOT NULL,
    ends_at         BIGINT,
    released        BOOLEAN NOT NULL,
    claiming        BOOLEAN NOT NULL,
    PRIMARY KEY (reservation_id, unit_id),
    CONSTRAINT node_reservation_units_no_overlap EXCLUDE USING gist (
        node_id WITH =, unit_id WITH =, int8range(starts_at, ends_at) WITH &&
    ) WHERE (claiming)
);
CREATE INDEX node_reservation_units_unit ON node_reservation_units (node_id, unit_id);
