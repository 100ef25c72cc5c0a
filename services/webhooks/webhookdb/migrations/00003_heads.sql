-- +goose Up
-- The head of each (endpoint, account): its pending delivery of the lowest
-- sequence, the only one sent (an account's events reach an endpoint in
-- order). Marked, so that a claim reads the due heads through their own
-- index instead of every pending delivery of the endpoint; each writer of
-- pending deliveries moves the mark in its transaction, under the
-- endpoint's row lock (deliveries.go, refreshHeadsSQL).
ALTER TABLE webhook_deliveries ADD COLUMN head boolean NOT NULL DEFAULT false;
UPDATE webhook_deliveries d SET head = true
FROM (SELECT endpoint_id, account_id, min(sequence) AS sequence FROM webhook_deliveries
      WHERE status = 'pending' GROUP BY endpoint_id, account_id) h
WHERE d.endpoint_id = h.endpoint_id AND d.account_id = h.account_id AND d.sequence = h.sequence;
CREATE INDEX webhook_deliveries_due_heads ON webhook_deliveries (endpoint_id, next_at) WHERE status = 'pending' AND head;
CREATE INDEX webhook_deliveries_account_heads ON webhook_deliveries (endpoint_id, account_id) WHERE status = 'pending' AND head;

-- +goose Down
DROP INDEX webhook_deliveries_account_heads;
DROP INDEX webhook_deliveries_due_heads;
ALTER TABLE webhook_deliveries DROP COLUMN head;
