-- +goose Up
-- Accounts of this region. A balance never drops below its floor; version
-- counts the postings applied and guards every balance update (CAS).
CREATE TABLE accounts (
    id          text COLLATE "C" PRIMARY KEY,
    client_id   text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('customer', 'issuance')),
    currency    char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    balance     bigint NOT NULL DEFAULT 0,
    floor       bigint NOT NULL DEFAULT 0 CHECK (floor <= 0),
    closed      boolean NOT NULL DEFAULT false,
    version     bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (balance >= floor)
);
-- One issuance account per currency in a region: funding draws from it.
CREATE UNIQUE INDEX accounts_issuance_currency ON accounts (currency) WHERE kind = 'issuance';

-- One row per transfer command, unique per (client, idempotency key): the
-- business key that catches a duplicate even after its consume-log row expired.
CREATE TABLE transfers (
    id              text COLLATE "C" PRIMARY KEY,
    client_id       text COLLATE "C" NOT NULL,
    idempotency_key text COLLATE "C" NOT NULL,
    fingerprint     bytea NOT NULL,
    type            text NOT NULL CHECK (type IN ('transfer', 'fund')),
    from_account    text COLLATE "C" NOT NULL,
    to_account      text COLLATE "C" NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        char(3) NOT NULL,
    status          text NOT NULL CHECK (status IN ('PENDING', 'DEBITED', 'COMPLETED', 'REFUNDED', 'REJECTED')),
    reason          text,
    version         bigint NOT NULL,
    created_at      timestamptz NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (client_id, idempotency_key),
    CHECK ((status = 'REJECTED') = (reason IS NOT NULL))
);

-- The change-log. Every balance change is one posting; a transfer has at
-- most one posting per leg (business key), and an account's postings are
-- numbered by the account version they produced.
CREATE TABLE postings (
    transfer_id     text COLLATE "C" NOT NULL,
    leg             text NOT NULL CHECK (leg IN ('debit', 'credit', 'refund')),
    account_id      text COLLATE "C" NOT NULL,
    amount          bigint NOT NULL CHECK (amount <> 0),
    balance_after   bigint NOT NULL,
    account_version bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (transfer_id, leg),
    UNIQUE (account_id, account_version)
);

-- +goose Down
DROP TABLE postings;
DROP TABLE transfers;
DROP TABLE accounts;
