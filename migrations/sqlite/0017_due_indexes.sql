-- The reconciler reads only what is due. Its pass looks for reservations whose start,
-- end, lease deadline, next attempt or confirmation deadline has passed (one indexed
-- range per due time, 0011), for nodes that stopped reporting and nodes marked lost, and
-- for bindings being unbound. The index on every reservation's state made SQLite read
-- every live reservation for the due times instead (it prefers an equality on `state` to
-- a range on a partial index); live states keep an index of their own (the metrics' count
-- of live reservations), and drafts one by age (the draft sweep).
DROP INDEX compute_reservations_state;
CREATE INDEX compute_reservations_live ON compute_reservations (state)
    WHERE state IN ('awaiting-confirmation', 'pending', 'placed', 'binding', 'active', 'releasing');
CREATE INDEX compute_reservations_drafts ON compute_reservations (created_at)
    WHERE state = 'draft';
CREATE INDEX nodes_watched ON nodes (last_seen_at)
    WHERE agent_seen_at IS NOT NULL AND lost_at IS NULL;
CREATE INDEX nodes_lost ON nodes (id) WHERE lost_at IS NOT NULL;
CREATE INDEX reservation_bindings_status ON reservation_bindings (status);
