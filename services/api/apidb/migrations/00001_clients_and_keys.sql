-- +goose Up
-- API clients. Every region holds the same clients (the admin tool writes
-- them to all); an API key is stored only as its SHA-256.
--
-- IF NOT EXISTS: a database migrated by an earlier release has these tables
-- from the ledger's migrations 00003 and 00004 (now empty); this set adopts
-- them as they are. A fresh database gets them here.
CREATE TABLE IF NOT EXISTS clients (
    id            text COLLATE "C" PRIMARY KEY,
    name          text NOT NULL,
    key_hash      bytea NOT NULL UNIQUE,
    rate_per_sec  int NOT NULL DEFAULT 100 CHECK (rate_per_sec > 0),
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Idempotency keys of POST /v1/transfers, scoped to the client, kept in the
-- home region of the source account. The first response is stored here: by
-- the ledger in the transaction that applies the transfer (through this
-- package's Answers), or by the API when it answered before the ledger did.
-- A repeat gets it back unchanged.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    client_id       text COLLATE "C" NOT NULL,
    key             text COLLATE "C" NOT NULL,
    fingerprint     bytea NOT NULL,
    transfer_id     text COLLATE "C" NOT NULL,
    state           text NOT NULL CHECK (state IN ('in_flight', 'done')),
    lease_until     timestamptz NOT NULL,
    response_status int,
    response_body   bytea,
    response_final  boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (client_id, key),
    CHECK ((state = 'done') = (response_status IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expiry ON idempotency_keys (expires_at);

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE clients;
