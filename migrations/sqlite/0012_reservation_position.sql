-- A new reservation takes the next position (MAX + 1): read from an index, not a scan.
CREATE INDEX compute_reservations_position ON compute_reservations (position);

-- A pool's member list changed: the capacity view reads it again. Such rows name the pool
-- and no node.
ALTER TABLE capacity_changes ADD COLUMN pool_id TEXT;

CREATE TRIGGER capacity_pool_nodes_insert AFTER INSERT ON pool_nodes
BEGIN INSERT INTO capacity_changes (node_id, pool_id) VALUES ('', NEW.pool_id); END;
CREATE TRIGGER capacity_pool_nodes_delete AFTER DELETE ON pool_nodes
BEGIN INSERT INTO capacity_changes (node_id, pool_id) VALUES ('', OLD.pool_id); END;
