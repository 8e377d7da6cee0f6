-- Metering and provider payouts.
--
-- A booking carries the price per GPU-hour (integer minor currency units) of the tenant's
-- offer when its unit was booked, so later offer changes never reprice what was sold.
-- Rows booked before this migration accrue at 0.

ALTER TABLE bookings ADD COLUMN price_per_gpu_hour_minor BIGINT NOT NULL DEFAULT 0;

-- Money paid out to a provider org from its earnings. Append-only: what is available for
-- payout is the org's earnings minus the sum of its rows. `seq` orders an org's payouts
-- (they are written one at a time per org); `id` is the public `pay_…` id.
CREATE TABLE payouts (
    seq           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    org_id        TEXT NOT NULL REFERENCES orgs (id),
    amount_minor  BIGINT NOT NULL CHECK (amount_minor > 0),
    reference     TEXT,
    created_at    BIGINT NOT NULL,
    created_by    TEXT NOT NULL
);
CREATE INDEX payouts_org ON payouts (org_id, seq);
