-- Every change to a node's capacity (what a unit offers, what books it, what claims it) is
-- announced on channel `orl_capacity` with the node's id, at commit and only if it commits.
-- Each replica's capacity view listens and loads those nodes again.
CREATE FUNCTION capacity_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('orl_capacity', OLD.node_id);
    ELSE
        PERFORM pg_notify('orl_capacity', NEW.node_id);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE FUNCTION capacity_node_changed() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('orl_capacity', NEW.id);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER capacity_bookings AFTER INSERT OR DELETE OR UPDATE OF active, start_ms, end_ms ON bookings
    FOR EACH ROW EXECUTE FUNCTION capacity_changed();
CREATE TRIGGER capacity_host_bookings AFTER INSERT OR UPDATE OR DELETE ON host_bookings
    FOR EACH ROW EXECUTE FUNCTION capacity_changed();
CREATE TRIGGER capacity_units AFTER INSERT OR UPDATE OR DELETE ON units
    FOR EACH ROW EXECUTE FUNCTION capacity_changed();
CREATE TRIGGER capacity_node_reservations AFTER INSERT OR UPDATE ON node_reservations
    FOR EACH ROW EXECUTE FUNCTION capacity_changed();
CREATE TRIGGER capacity_node_reservation_units AFTER INSERT OR UPDATE OR DELETE ON node_reservation_units
    FOR EACH ROW EXECUTE FUNCTION capacity_changed();
CREATE TRIGGER capacity_bindings AFTER INSERT OR UPDATE OF status, stuck_since ON reservation_bindings
    FOR EACH ROW EXECUTE FUNCTION capacity_changed();
CREATE TRIGGER capacity_nodes
    AFTER INSERT OR UPDATE OF region, labels, host_vcpu, host_memory_gib, host_hugepages_1gi, topology_gen, lost_at
    ON nodes FOR EACH ROW EXECUTE FUNCTION capacity_node_changed();

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
