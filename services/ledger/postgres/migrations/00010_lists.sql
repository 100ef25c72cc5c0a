-- +goose Up
-- A client's transfers and accounts, newest first, a page at a time: the
-- lists read these indexes from a cursor (created_at, id) downwards.
CREATE INDEX transfers_client_created ON transfers (client_id, created_at DESC, id DESC);
CREATE INDEX accounts_client_created ON accounts (client_id, created_at DESC, id DESC) WHERE kind = 'customer';

-- +goose Down
DROP INDEX accounts_client_created;
DROP INDEX transfers_client_created;
