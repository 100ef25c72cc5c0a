-- +goose Up
-- When a transfer reached its final state: set by the settle step of a
-- cross-region transfer; a same-region transfer settles when applied.
ALTER TABLE transfers ADD COLUMN settled_at timestamptz;

-- +goose Down
ALTER TABLE transfers DROP COLUMN settled_at;
