-- +goose Up
-- How many times a delivery was asked for again (POST /v1/events/{id}/redeliver):
-- sent with each attempt, so that a receiver can tell a redelivery from a retry.
ALTER TABLE webhook_deliveries ADD COLUMN redeliveries int NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE webhook_deliveries DROP COLUMN redeliveries;
