-- Pools, offers and quota; compute reservations and their per-unit bookings; tenant IAM
-- policies and confirmation requests.

CREATE TABLE pools (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    owner_org_id  TEXT NOT NULL REFERENCES orgs (id),
    policy        TEXT NOT NULL,
    archived_at   BIGINT,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);

CREATE TABLE pool_nodes (
    pool_id  TEXT NOT NULL REFERENCES pools (id),
    node_id  TEXT NOT NULL REFERENCES nodes (id),
    PRIMARY KEY (pool_id, node_id)
);

CREATE TABLE offers (
    pool_id                   TEXT NOT NULL REFERENCES pools (id),
    tenant_id                 TEXT NOT NULL REFERENCES orgs (id),
    quota                     TEXT NOT NULL,
    price_per_gpu_hour_minor  BIGINT,
    budget_minor              BIGINT,
    created_at                BIGINT NOT NULL,
    updated_at                BIGINT NOT NULL,
    PRIMARY KEY (pool_id, tenant_id)
);

-- What each tenant holds of each quota resource in a pool. Charged once when a draft is
-- allowed, refunded once at the reservation's terminal state.
CREATE TABLE quota_usage (
    pool_id    TEXT NOT NULL,
    tenant_id  TEXT NOT NULL,
    resource   TEXT NOT NULL,
    used       BIGINT NOT NULL CHECK (used >= 0),
    PRIMARY KEY (pool_id, tenant_id, resource)
);

CREATE TABLE compute_reservations (
    id                   TEXT PRIMARY KEY,
    -- Creation order (ties only between concurrent creates): queues and lists follow it.
    position             BIGINT NOT NULL,
    tenant_id            TEXT NOT NULL REFERENCES orgs (id),
    pool_id              TEXT NOT NULL REFERENCES pools (id),
    project_id           TEXT,
    caller_key_id        TEXT NOT NULL,
    idempotency_key      TEXT NOT NULL,
    request              TEXT NOT NULL,
    state                TEXT NOT NULL,
    spot                 BOOLEAN NOT NULL,
    binding              TEXT NOT NULL,
    start_ms             BIGINT NOT NULL,
    end_ms               BIGINT NOT NULL,
    lease_seconds        BIGINT,
    lease_deadline_ms    BIGINT,
    resources            TEXT NOT NULL,
    charge               TEXT,
    conditions           TEXT NOT NULL,
    reason               TEXT,
    node_id              TEXT,
    placed_by            TEXT,
    confirmation_id      TEXT,
    extend_started_ms    BIGINT,
    next_attempt_ms      BIGINT,
    operation            TEXT,
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL
);
CREATE INDEX compute_reservations_tenant ON compute_reservations (tenant_id, position);
CREATE INDEX compute_reservations_state ON compute_reservations (state);

-- One unit held by one compute reservation over [start_ms, end_ms).
-- Rule: two active bookings of one unit never overlap.
CREATE TABLE bookings (
    reservation_id  TEXT NOT NULL REFERENCES compute_reservations (id),
    node_id         TEXT NOT NULL,
    unit_id         TEXT NOT NULL,
    start_ms        BIGINT NOT NULL,
    end_ms          BIGINT NOT NULL,
    spot            BOOLEAN NOT NULL,
    active          BOOLEAN NOT NULL,
    PRIMARY KEY (reservation_id, unit_id),
    CONSTRAINT bookings_no_overlap EXCLUDE USING gist (
        node_id WITH =, unit_id WITH =, int8range(start_ms, end_ms) WITH &&
    ) WHERE (active)
);
CREATE INDEX bookings_unit ON bookings (node_id, unit_id);

-- Host CPU, memory and 1 GiB hugepages booked on a node with the devices.
CREATE TABLE host_bookings (
    reservation_id  TEXT NOT NULL REFERENCES compute_reservations (id),
    node_id         TEXT NOT NULL,
    vcpu            BIGINT NOT NULL,
    memory_gib      BIGINT NOT NULL,
    hugepages_1gi   BIGINT NOT NULL,
    start_ms        BIGINT NOT NULL,
    end_ms          BIGINT NOT NULL,
    active          BOOLEAN NOT NULL,
    PRIMARY KEY (reservation_id, node_id)
);
CREATE INDEX host_bookings_node ON host_bookings (node_id);

CREATE TABLE iam_policies (
    org_id      TEXT PRIMARY KEY REFERENCES orgs (id),
    policy      TEXT NOT NULL,
    updated_at  BIGINT NOT NULL
);

CREATE TABLE confirmations (
    id              TEXT PRIMARY KEY,
    org_id          TEXT NOT NULL REFERENCES orgs (id),
    reservation_id  TEXT NOT NULL,
    requested_by    TEXT NOT NULL,
    action          TEXT NOT NULL,
    attributes      TEXT NOT NULL,
    state           TEXT NOT NULL,
    decided_by      TEXT,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    decided_at      BIGINT
);
CREATE INDEX confirmations_org ON confirmations (org_id, created_at);
