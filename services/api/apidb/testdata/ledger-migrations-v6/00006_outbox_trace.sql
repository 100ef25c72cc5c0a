-- +goose Up
-- The W3C traceparent of the step that wrote the row, so that the relayed
-- saga step continues the transfer's trace.
ALTER TABLE outbox ADD COLUMN trace_parent text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE outbox DROP COLUMN trace_parent;
