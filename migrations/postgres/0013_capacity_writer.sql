-- Capacity announcements name the writing transaction too (`<node id> <txid>`), so that a
-- replica passes over the announcements of its own transactions whose changes it has laid
-- onto its view already.
CREATE OR REPLACE FUNCTION capacity_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('orl_capacity', OLD.node_id || ' ' || txid_current());
    ELSE
        PERFORM pg_notify('orl_capacity', NEW.node_id || ' ' || txid_current());
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION capacity_node_changed() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('orl_capacity', NEW.id || ' ' || txid_current());
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
