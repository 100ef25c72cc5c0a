-- +goose Up
-- Who an API key belongs to: a client (accounts and transfers) or an
-- operator (the region's dead letters, /v1/ops/...). An operator moves no
-- money and a client reaches no operator endpoint. Existing keys are
-- clients'. An id keeps its role (PutClient refuses to change it).
ALTER TABLE clients ADD COLUMN IF NOT EXISTS role text NOT NULL DEFAULT 'client' CHECK (role IN ('client', 'operator'));

-- +goose Down
ALTER TABLE clients DROP COLUMN role;
