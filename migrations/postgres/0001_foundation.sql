-- Orgs, API keys, node inventory, the audit trail and the event outbox.
-- Every instant is stored as epoch milliseconds (BIGINT) so both databases compare them alike.

CREATE TABLE orgs (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    org_id       TEXT NOT NULL REFERENCES orgs (id),
    name         TEXT,
    secret_hash  TEXT NOT NULL UNIQUE,
    role         TEXT,
    permissions  TEXT NOT NULL,
    agent        BOOLEAN NOT NULL,
    legacy       BOOLEAN NOT NULL,
    created_by   TEXT,
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);
CREATE INDEX api_keys_org ON api_keys (org_id);

CREATE TABLE nodes (
    id                  TEXT PRIMARY KEY,
    org_id              TEXT NOT NULL REFERENCES orgs (id),
    region              TEXT,
    host_vcpu           BIGINT NOT NULL,
    host_memory_gib     BIGINT NOT NULL,
    host_hugepages_1gi  BIGINT NOT NULL,
    topology_gen        BIGINT NOT NULL,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL,
    last_seen_at        BIGINT NOT NULL
);
CREATE INDEX nodes_org ON nodes (org_id);

CREATE TABLE units (
    node_id        TEXT NOT NULL REFERENCES nodes (id),
    id             TEXT NOT NULL,
    position       BIGINT NOT NULL,
    class          TEXT NOT NULL,
    device_class   TEXT NOT NULL,
    model          TEXT NOT NULL,
    memory_gib     BIGINT NOT NULL,
    nvlink_domain  TEXT,
    sellable       BOOLEAN NOT NULL,
    PRIMARY KEY (node_id, id)
);

CREATE TABLE audit_log (
    seq           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            BIGINT NOT NULL,
    actor_key_id  TEXT,
    actor_org_id  TEXT,
    org_id        TEXT,
    action        TEXT NOT NULL,
    object_type   TEXT NOT NULL,
    object_id     TEXT NOT NULL,
    reason        TEXT,
    details       TEXT
);
CREATE INDEX audit_log_org ON audit_log (org_id, seq);

CREATE TABLE events (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          BIGINT NOT NULL,
    type        TEXT NOT NULL,
    object_id   TEXT NOT NULL,
    org_ids     TEXT NOT NULL,
    payload     TEXT NOT NULL
);
