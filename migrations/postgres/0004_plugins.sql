-- Policy plugins (WebAssembly components, stored by content hash so every replica can load
-- them) and the plugins each pool runs.

CREATE TABLE plugins (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    world       TEXT NOT NULL,
    size        BIGINT NOT NULL,
    bytes       BYTEA NOT NULL,
    created_by  TEXT,
    created_at  BIGINT NOT NULL
);

CREATE TABLE pool_policies (
    pool_id            TEXT PRIMARY KEY REFERENCES pools (id),
    placement          TEXT REFERENCES plugins (id),
    preemption         TEXT REFERENCES plugins (id),
    spend_limit        TEXT REFERENCES plugins (id),
    config             TEXT,
    deadline_ms        BIGINT,
    on_policy_failure  TEXT NOT NULL,
    updated_at         BIGINT NOT NULL
);
