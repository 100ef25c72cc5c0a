-- +goose Up
-- The most overdraft a client may give its own accounts through the API.
-- IF NOT EXISTS: adopted from the ledger's former 00004 (see 00001).
ALTER TABLE clients ADD COLUMN IF NOT EXISTS max_overdraft bigint NOT NULL DEFAULT 0 CHECK (max_overdraft >= 0);

-- +goose Down
ALTER TABLE clients DROP COLUMN max_overdraft;
