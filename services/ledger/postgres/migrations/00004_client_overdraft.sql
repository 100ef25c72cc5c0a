-- +goose Up
-- Moved to services/api/apidb with the clients table (see 00003).
SELECT 1;

-- +goose Down
SELECT 1;
