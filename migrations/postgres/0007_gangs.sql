-- Gangs: one compute reservation may hold units on several nodes, and two nodes may report
-- units with the same id, so a booking is keyed by its node as well as its unit.

ALTER TABLE bookings DROP CONSTRAINT bookings_pkey;
ALTER TABLE bookings ADD PRIMARY KEY (reservation_id, node_id, unit_id);
