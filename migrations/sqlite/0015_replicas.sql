-- The `orl serve` processes on this database: each records itself at start and says it is
-- alive every few seconds (wall-clock epoch milliseconds), so `GET /v1/status` can list
-- the replicas seen lately.
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    host TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    seen_at BIGINT NOT NULL
);
