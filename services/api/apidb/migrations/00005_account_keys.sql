-- +goose Up
-- Where an Idempotency-Key of POST /v1/accounts opens its account. A
-- client's key has one home region (api.AccountKeyHome: a hash of the
-- client and the key), whose API records here the region the first request
-- with it chose (its body's region, or the region it was sent to) and the
-- fingerprint of that request. Every retry, wherever it arrives, is sent
-- there and opens its account in that region, where the ledger's own
-- unique key (accounts_client_key) makes it one account. Kept for as long
-- as the accounts keep their keys: for ever.
CREATE TABLE IF NOT EXISTS account_keys (
    client_id   text NOT NULL,
    key         text NOT NULL COLLATE "C",
    fingerprint bytea NOT NULL,
    region      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client_id, key)
);

-- +goose Down
DROP TABLE IF EXISTS account_keys;
