-- The nodes whose capacity changed, in commit order (one writer): what a unit offers, what
-- books it, and what claims it. The process's capacity view reads past its cursor and loads
-- those nodes again; rows it has read are pruned.
CREATE TABLE capacity_changes (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id TEXT NOT NULL
);

CREATE TRIGGER capacity_bookings_insert AFTER INSERT ON bookings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_bookings_update AFTER UPDATE OF active, start_ms, end_ms ON bookings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_bookings_delete AFTER DELETE ON bookings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (OLD.node_id); END;

CREATE TRIGGER capacity_host_bookings_insert AFTER INSERT ON host_bookings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_host_bookings_update AFTER UPDATE ON host_bookings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_host_bookings_delete AFTER DELETE ON host_bookings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (OLD.node_id); END;

CREATE TRIGGER capacity_units_insert AFTER INSERT ON units
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_units_update AFTER UPDATE ON units
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_units_delete AFTER DELETE ON units
BEGIN INSERT INTO capacity_changes (node_id) VALUES (OLD.node_id); END;

CREATE TRIGGER capacity_nodes_insert AFTER INSERT ON nodes
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.id); END;
CREATE TRIGGER capacity_nodes_update
AFTER UPDATE OF region, labels, host_vcpu, host_memory_gib, host_hugepages_1gi, topology_gen, lost_at ON nodes
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.id); END;

CREATE TRIGGER capacity_node_reservations_insert AFTER INSERT ON node_reservations
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_node_reservations_update AFTER UPDATE ON node_reservations
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_node_reservation_units_insert AFTER INSERT ON node_reservation_units
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_node_reservation_units_update AFTER UPDATE ON node_reservation_units
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_node_reservation_units_delete AFTER DELETE ON node_reservation_units
BEGIN INSERT INTO capacity_changes (node_id) VALUES (OLD.node_id); END;

CREATE TRIGGER capacity_bindings_insert AFTER INSERT ON reservation_bindings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;
CREATE TRIGGER capacity_bindings_update AFTER UPDATE OF status, stuck_since ON reservation_bindings
BEGIN INSERT INTO capacity_changes (node_id) VALUES (NEW.node_id); END;

-- The reconciler's work lists read only what is due.
CREATE INDEX compute_reservations_due_start ON compute_reservations (start_ms) WHERE state = 'placed';
CREATE INDEX compute_reservations_due_end ON compute_reservations (end_ms)
    WHERE state IN ('pending', 'placed', 'binding', 'active');
CREATE INDEX compute_reservations_due_lease ON compute_reservations (lease_deadline_ms)
    WHERE lease_deadline_ms IS NOT NULL;
CREATE INDEX compute_reservations_due_attempt ON compute_reservations (next_attempt_ms) WHERE state = 'pending';
CREATE INDEX compute_reservations_pending ON compute_reservations (pool_id, position) WHERE state = 'pending';
CREATE INDEX compute_reservations_due_confirmation ON compute_reservations (created_at)
    WHERE state = 'awaiting-confirmation';
