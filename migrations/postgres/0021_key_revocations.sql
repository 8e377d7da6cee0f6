-- A revoked (or removed) API key is announced on channel `orl_keys` with its id, at commit
-- and only if it commits, however it was revoked: every replica's key cache forgets it.
CREATE FUNCTION api_key_revoked() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('orl_keys', OLD.id);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER api_keys_revoked AFTER UPDATE OF revoked_at ON api_keys
    FOR EACH ROW WHEN (NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL)
    EXECUTE FUNCTION api_key_revoked();
CREATE TRIGGER api_keys_removed AFTER DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION api_key_revoked();
