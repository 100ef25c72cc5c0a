-- +goose Up
-- An account's transfers, newest first, as payer and as payee: the list's
-- account filter merges the first page of each.
CREATE INDEX transfers_from_created ON transfers (from_account, created_at DESC, id DESC);
CREATE INDEX transfers_to_created ON transfers (to_account, created_at DESC, id DESC);
-- The list's reference filter finds REJECTED transfers too, which the
-- unique index (transfers_reference) leaves out.
CREATE INDEX transfers_client_reference ON transfers (client_id, reference) WHERE reference IS NOT NULL;
-- A balance as of an instant and a statement's bounds walk an account's
-- change-log by version and stop at a time: with the time in the index the
-- walk reads no table row.
ALTER TABLE postings DROP CONSTRAINT postings_account_id_account_version_key,
    ADD CONSTRAINT postings_account_version UNIQUE (account_id, account_version) INCLUDE (created_at);

-- +goose Down
ALTER TABLE postings DROP CONSTRAINT postings_account_version,
    ADD CONSTRAINT postings_account_id_account_version_key UNIQUE (account_id, account_version);
DROP INDEX transfers_client_reference;
DROP INDEX transfers_to_created;
DROP INDEX transfers_from_created;
