-- +goose Up
-- A client's API keys: several at once, so that a rotation overlaps (the
-- new key works before the old one is revoked), each with an optional
-- expiry and a revocation time. Only the SHA-256 of a key is kept; key_id,
-- the first 8 hex digits of that hash, names a key to its owner and the
-- operator without revealing it. The key each client was registered with
-- becomes its first key.
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash   bytea PRIMARY KEY,
    client_id  text NOT NULL REFERENCES clients (id),
    key_id     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    revoked_at timestamptz,
    UNIQUE (client_id, key_id)
);
INSERT INTO api_keys (key_hash, client_id, key_id)
SELECT key_hash, id, substr(encode(key_hash, 'hex'), 1, 8) FROM clients
ON CONFLICT DO NOTHING;

-- +goose Down
DROP TABLE api_keys;
