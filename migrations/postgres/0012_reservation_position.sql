-- A new reservation takes the next position (MAX + 1): read from an index, not a scan.
CREATE INDEX compute_reservations_position ON compute_reservations (position);

-- A pool's member list changed: announced on channel `orl_pools` with the pool's id, and
-- read again by every replica's capacity view.
CREATE FUNCTION capacity_pool_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('orl_pools', OLD.pool_id);
    ELSE
        PERFORM pg_notify('orl_pools', NEW.pool_id);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER capacity_pool_nodes AFTER INSERT OR UPDATE OR DELETE ON pool_nodes
    FOR EACH ROW EXECUTE FUNCTION capacity_pool_changed();
