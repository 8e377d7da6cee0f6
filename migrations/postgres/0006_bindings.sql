-- Bindings: what a node agent is asked to bind or unbind, node liveness, and booking time
-- carried past its end while a Kubernetes node still holds released devices.

-- A node is watched for liveness once its agent has spoken to the platform
-- (`agent_seen_at`); it is lost (`lost_at`) when it stops reporting, until it reports again.
ALTER TABLE nodes ADD COLUMN agent_seen_at BIGINT;
ALTER TABLE nodes ADD COLUMN lost_at BIGINT;

-- Where a booking's billed time ends when it was carried past its end (unbilled); NULL
-- means billed until `end_ms`.
ALTER TABLE bookings ADD COLUMN billable_end_ms BIGINT;

-- One row per `node` or `kubernetes` reservation once its window starts: what its node
-- was asked to do and what it reported.
--   status: binding (bind asked) | bound | unbinding (unbind asked, devices may be held)
--           | released (the node gave the devices back) | failed | lost (the node was lost)
CREATE TABLE reservation_bindings (
    reservation_id       TEXT PRIMARY KEY REFERENCES compute_reservations (id),
    node_id              TEXT NOT NULL,
    binding              TEXT NOT NULL,
    status               TEXT NOT NULL,
    message              TEXT,
    requested_at         BIGINT NOT NULL,
    bound_at             BIGINT,
    unbind_requested_at  BIGINT,
    -- Set when held devices outlived their booking's end (the node is KubernetesReleaseStuck).
    stuck_since          BIGINT,
    released_at          BIGINT,
    updated_at           BIGINT NOT NULL
);
CREATE INDEX reservation_bindings_node ON reservation_bindings (node_id, status);
