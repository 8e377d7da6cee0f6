-- A version per compute reservation, bumped by every write: a transition is one update
-- conditional on the version its decision read, so a stale copy never overwrites a newer
-- state (an extend, a renew, a release that committed in between).
ALTER TABLE compute_reservations ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
