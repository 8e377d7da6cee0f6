-- Labels: a node and each of its units may carry labels (a JSON object of string to string),
-- matched by device selectors and usable as a gang's topology key.

ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
ALTER TABLE units ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
