-- +goose Up
-- The most overdraft a client may give its own accounts through the API.
ALTER TABLE clients ADD COLUMN max_overdraft bigint NOT NULL DEFAULT 0 CHECK (max_overdraft >= 0);

-- +goose Down
ALTER TABLE clients DROP COLUMN max_overdraft;
