-- +goose Up
-- Accounts are closed, frozen and unfrozen by their clients' requests, each
-- a command through the ledger stream like a capture: its record, unique
-- per client and idempotency key, is its business key.
ALTER TABLE accounts ADD COLUMN frozen boolean NOT NULL DEFAULT false;
CREATE TABLE account_actions (
    client_id       text COLLATE "C" NOT NULL,
    idempotency_key text COLLATE "C" NOT NULL,
    fingerprint     bytea NOT NULL,
    account_id      text COLLATE "C" NOT NULL REFERENCES accounts (id),
    type            text NOT NULL CHECK (type IN ('close', 'freeze', 'unfreeze')),
    status          text NOT NULL CHECK (status IN ('APPLIED', 'REJECTED')),
    reason          text,
    created_at      timestamptz NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY (client_id, idempotency_key),
    CHECK ((status = 'REJECTED') = (reason IS NOT NULL))
);
CREATE INDEX account_actions_account ON account_actions (account_id, applied_at);
-- An account closes once.
CREATE UNIQUE INDEX account_actions_closed ON account_actions (account_id) WHERE type = 'close' AND status = 'APPLIED';
-- The records of both kinds of action, as the apply reads a request's
-- business key and the API a repeat's first answer.
CREATE VIEW actions AS
    SELECT client_id, idempotency_key, fingerprint, transfer_id, '' AS account_id, type, amount, status, reason, created_at
    FROM transfer_actions
    UNION ALL
    SELECT client_id, idempotency_key, fingerprint, '', account_id, type, 0, status, reason, created_at
    FROM account_actions;
-- A close reads the account's transfers on their way to another region.
CREATE INDEX transfers_in_flight ON transfers (from_account) WHERE status = 'DEBITED';

-- +goose Down
DROP INDEX transfers_in_flight;
DROP VIEW actions;
DROP TABLE account_actions;
ALTER TABLE accounts DROP COLUMN frozen;
