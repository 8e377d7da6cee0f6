-- A node's live bookings, read by node without its history. A placement sums the host
-- resources booked on its node, and a node loaded into the capacity view reads its active
-- bookings; through the indexes on every booking of a node they also read every booking
-- the node ever held, which grows with each reservation it served. These partial indexes
-- hold only what is active; the queries say `active IS TRUE`, as these predicates do.
CREATE INDEX bookings_live ON bookings (node_id, unit_id, start_ms) WHERE active IS TRUE;
DROP INDEX host_bookings_node;
CREATE INDEX host_bookings_live ON host_bookings (node_id, start_ms) WHERE active IS TRUE;

-- The overlap check reads the unit's live bookings through the same index.
DROP TRIGGER bookings_no_overlap_insert;
CREATE TRIGGER bookings_no_overlap_insert
BEFORE INSERT ON bookings
WHEN NEW.active AND EXISTS (
    SELECT 1 FROM bookings o
    WHERE o.active IS TRUE AND o.node_id = NEW.node_id AND o.unit_id = NEW.unit_id
      AND o.end_ms > NEW.start_ms AND NEW.end_ms > o.start_ms
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap');
END;

DROP TRIGGER bookings_no_overlap_update;
CREATE TRIGGER bookings_no_overlap_update
BEFORE UPDATE OF active, start_ms, end_ms ON bookings
WHEN NEW.active AND EXISTS (
    SELECT 1 FROM bookings o
    WHERE o.active IS TRUE AND o.node_id = NEW.node_id AND o.unit_id = NEW.unit_id
      AND o.reservation_id <> NEW.reservation_id
      AND o.end_ms > NEW.start_ms AND NEW.end_ms > o.start_ms
)
BEGIN
    SELECT RAISE(ABORT, 'bookings_no_overlap');
END;
