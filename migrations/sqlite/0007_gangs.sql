-- Gangs: one compute reservation may hold units on several nodes, and two nodes may report
-- units with the same id, so a booking is keyed by its node as well as its unit. SQLite
-- cannot change a primary key in place: the table is rebuilt with its index and the
-- triggers that keep two active bookings of one unit from overlapping. Every column of
-- `bookings` as of 0006 is carried over; a column added to it before 0007 must be added here.

CREATE TABLE bookings_by_node (
    reservation_id            TEXT NOT NULL REFERENCES compute_reservations (id),
    node_id                   TEXT NOT NULL,
    unit_id                   TEXT NOT NULL,
    start_ms                  BIGINT NOT NULL,
    end_ms                    BIGINT NOT NULL,
    spot                      INTEGER NOT NULL,
    active                    INTEGER NOT NULL,
    price_per_gpu_hour_minor  BIGINT NOT NULL DEFAULT 0,
    billable_end_ms           BIGINT,
    PRIMARY KEY (reservation_id, node_id, unit_id)
);
INSERT INTO bookings_by_node (reservation_id, node_id, unit_id, start_ms, end_ms, spot, active,
                              price_per_gpu_hour_minor, billable_end_ms)
    SELECT reservation_id, node_id, unit_id, start_ms, end_ms, spot, active, price_per_gpu_hour_minor,
           billable_end_ms
    FROM bookings;
DROP TABLE bookings;
ALTER TABLE bookings_by_node RENAME TO bookings;
CREATE INDEX bookings_unit ON bookings (node_id, unit_id);

CREATE TRIGGER bookings_no_overlap_insert
BEFORE INSERT ON bookings
WHEN NEW.active AND EXISTS (
    SELECT 1 FROM bookings o
    WHERE o.active AND o.node_id = NEW.node_id AND o.unit_id = NEW.unit_id
      AND o.end_ms > NEW.start_ms AND NEW.end_ms > o.start_ms
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap');
END;

CREATE TRIGGER bookings_no_overlap_update
BEFORE UPDATE OF active, start_ms, end_ms ON bookings
WHEN NEW.active AND EXISTS (
    SELECT 1 FROM bookings o
    WHERE o.active AND o.node_id = NEW.node_id AND o.unit_id = NEW.unit_id
      AND o.reservation_id <> NEW.reservation_id
      AND o.end_ms > NEW.start_ms AND NEW.end_ms > o.start_ms
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap');
END;
