-- The version of the orl:policy package each plugin implements. Every plugin stored before
-- this column existed was built against orl:policy@0.1.0, the only version served then.
ALTER TABLE plugins ADD COLUMN policy_version TEXT NOT NULL DEFAULT 'orl:policy@0.1.0';
