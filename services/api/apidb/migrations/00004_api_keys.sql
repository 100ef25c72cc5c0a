-- +goose Up
-- A client's API keys: several at once, so that a rotation overlaps (the
-- new key works before the old one is revoked), each with an optional
-- expiry and a revocation time. Only the SHA-256 of a key is kept; key_id,
-- the first 8 hex digits of that hash, names a key to its owner and the
-- operator without revealing it. The key each client was registered with
-- becomes its first key, and clients keeps no key of its own.
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
ALTER TABLE clients DROP COLUMN key_hash;

-- +goose Down
-- Each client keeps its newest key.
ALTER TABLE clients ADD COLUMN key_hash bytea UNIQUE;
UPDATE clients c SET key_hash = (SELECT k.key_hash FROM api_keys k WHERE k.client_id = c.id ORDER BY k.created_at DESC LIMIT 1);
DROP TABLE api_keys;
