-- +goose Up
-- Moved: the API's clients and idempotency keys are the API's own schema,
-- migrated by services/api/apidb (its set, recorded in
-- api_schema_version). This version stays, empty, so that the ledger's
-- history is the same on every database: one migrated by an earlier release
-- has the tables from here, and the API's set adopts them (IF NOT EXISTS).
SELECT 1;

-- +goose Down
SELECT 1;
