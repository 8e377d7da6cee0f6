-- The terms a booking was made on, frozen with it: the model and device class of its unit
-- (so replacing a node's inventory never re-labels or drops past bookings from earnings)
-- and the provider's share in basis points (so changing the share never re-rates them).
-- NULL on bookings made before this migration: earnings then read the unit and the
-- current share, as they did.
ALTER TABLE bookings ADD COLUMN model TEXT;
ALTER TABLE bookings ADD COLUMN device_class TEXT;
ALTER TABLE bookings ADD COLUMN provider_share_bps BIGINT;
