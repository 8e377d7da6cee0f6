-- Node reservations: exclusive placement rights over units of one node for an audience.
-- `lifecycle` stores what time cannot tell (granted, needs-review, cancelled); pending,
-- active and expired follow from the term and the clock.

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
-- Rule: two claiming rows never hold one unit for overlapping terms. PostgreSQL enforces it
-- with an exclusion constraint; here the triggers below do (NULL ends_at = open-ended).
CREATE TABLE node_reservation_units (
    reservation_id  TEXT NOT NULL REFERENCES node_reservations (id),
    node_id         TEXT NOT NULL,
    unit_id         TEXT NOT NULL,
    position        BIGINT NOT NULL,
    starts_at       BIGINT NOT NULL,
    ends_at         BIGINT,
    released        INTEGER NOT NULL,
    claiming        INTEGER NOT NULL,
    PRIMARY KEY (reservation_id, unit_id)
);
CREATE INDEX node_reservation_units_unit ON node_reservation_units (node_id, unit_id);

CREATE TRIGGER node_reservation_units_no_overlap_insert
BEFORE INSERT ON node_reservation_units
WHEN NEW.claiming AND EXISTS (
    SELECT 1 FROM node_reservation_units o
    WHERE o.claiming AND o.node_id = NEW.node_id AND o.unit_id = NEW.unit_id
      AND (o.ends_at IS NULL OR o.ends_at > NEW.starts_at)
      AND (NEW.ends_at IS NULL OR NEW.ends_at > o.starts_at)
)
BEGIN
    SELECT RAISE(ABORT, 'node_reservation_units_no_overlap');
END;

CREATE TRIGGER node_reservation_units_no_overlap_update
BEFORE UPDATE OF claiming, starts_at, ends_at ON node_reservation_units
WHEN NEW.claiming AND EXISTS (
    SELECT 1 FROM node_reservation_units o
    WHERE o.claiming AND o.node_id = NEW.node_id AND o.unit_id = NEW.unit_id
      AND o.reservation_id <> NEW.reservation_id
      AND (o.ends_at IS NULL OR o.ends_at > NEW.starts_at)
      AND (NEW.ends_at IS NULL OR NEW.ends_at > o.starts_at)
)
BEGIN
    SELECT RAISE(ABORT, 'node_reservation_units_no_overlap');
END;
