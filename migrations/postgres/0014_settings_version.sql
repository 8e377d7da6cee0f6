-- One version of everything a decision reads besides capacity: pools, offers, IAM
-- policies and plugin assignments. Every write to them bumps it in the same transaction,
-- so a replica that reads the version knows whether what it holds of them is current.
CREATE TABLE settings_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO settings_version (id, version) VALUES (1, 0);

CREATE FUNCTION settings_changed() RETURNS trigger AS $$
BEGIN
    UPDATE settings_version SET version = version + 1;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER pools_settings AFTER INSERT OR UPDATE OR DELETE ON pools
    FOR EACH STATEMENT EXECUTE FUNCTION settings_changed();

CREATE TRIGGER offers_settings AFTER INSERT OR UPDATE OR DELETE ON offers
    FOR EACH STATEMENT EXECUTE FUNCTION settings_changed();

CREATE TRIGGER iam_policies_settings AFTER INSERT OR UPDATE OR DELETE ON iam_policies
    FOR EACH STATEMENT EXECUTE FUNCTION settings_changed();

CREATE TRIGGER pool_policies_settings AFTER INSERT OR UPDATE OR DELETE ON pool_policies
    FOR EACH STATEMENT EXECUTE FUNCTION settings_changed();
