-- One version of everything a decision reads besides capacity: pools, offers, IAM
-- policies and plugin assignments. Every write to them bumps it in the same transaction,
-- so a replica that reads the version knows whether what it holds of them is current.
CREATE TABLE settings_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO settings_version (id, version) VALUES (1, 0);

CREATE TRIGGER pools_insert_settings AFTER INSERT ON pools
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER pools_update_settings AFTER UPDATE ON pools
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER pools_delete_settings AFTER DELETE ON pools
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER offers_insert_settings AFTER INSERT ON offers
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER offers_update_settings AFTER UPDATE ON offers
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER offers_delete_settings AFTER DELETE ON offers
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER iam_policies_insert_settings AFTER INSERT ON iam_policies
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER iam_policies_update_settings AFTER UPDATE ON iam_policies
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER iam_policies_delete_settings AFTER DELETE ON iam_policies
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER pool_policies_insert_settings AFTER INSERT ON pool_policies
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER pool_policies_update_settings AFTER UPDATE ON pool_policies
BEGIN
    UPDATE settings_version SET version = version + 1;
END;

CREATE TRIGGER pool_policies_delete_settings AFTER DELETE ON pool_policies
BEGIN
    UPDATE settings_version SET version = version + 1;
END;
