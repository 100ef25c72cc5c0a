-- +goose Up
-- Moved to services/api/postgres with the clients table (see 00003).
SELECT 1;

-- +goose Down
SELECT 1;
