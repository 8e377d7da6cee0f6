-- A node's live bookings, read by node without its history. A placement sums the host
-- resources booked on its node, and a node loaded into the capacity view reads its active
-- bookings; through the indexes on every booking of a node they also read every booking
-- the node ever held, which grows with each reservation it served. These partial indexes
-- hold only what is active. The queries say `active IS TRUE`, as these predicates do: with
-- `active` alone the planner may take the overlap constraint's GiST index instead, which
-- orders entries by unit and would be read whole to find one node's.
CREATE INDEX bookings_live ON bookings (node_id, unit_id, start_ms) WHERE active IS TRUE;
DROP INDEX host_bookings_node;
CREATE INDEX host_bookings_live ON host_bookings (node_id, start_ms) WHERE active IS TRUE;
