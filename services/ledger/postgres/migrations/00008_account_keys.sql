-- +goose Up
-- Opening an account is safe to retry: an account opened under a client's
-- Idempotency-Key records the key and the fingerprint of the request
-- (sha-256 of its body), and the key opens at most one account per
-- client. A retry with the same request finds that account; with another
-- request it is refused (idempotency_key_reused). Accounts opened without
-- a key have neither.
ALTER TABLE accounts ADD COLUMN idempotency_key text COLLATE "C";
ALTER TABLE accounts ADD COLUMN request_hash bytea;
ALTER TABLE accounts ADD CONSTRAINT accounts_key_check
    CHECK ((idempotency_key IS NULL) = (request_hash IS NULL));
CREATE UNIQUE INDEX accounts_client_key ON accounts (client_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- +goose Down
DROP INDEX accounts_client_key;
ALTER TABLE accounts DROP CONSTRAINT accounts_key_check;
ALTER TABLE accounts DROP COLUMN request_hash;
ALTER TABLE accounts DROP COLUMN idempotency_key;
