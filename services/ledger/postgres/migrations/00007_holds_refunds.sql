-- +goose Up
-- Authorizations and refunds.
--
-- A hold reserves money on its source account: the account's held grows,
-- its balance does not, and a debit may only use what is available
-- (balance - held) above the floor. held always equals the amounts of the
-- account's transfers in status HELD (paymesh verify checks it).
ALTER TABLE accounts ADD COLUMN held bigint NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD CONSTRAINT accounts_held_check CHECK (held >= 0 AND balance::numeric - held >= floor);

-- A hold is a transfer in status HELD until it is captured (COMPLETED, or
-- DEBITED on its way to another region), voided (VOIDED) or expired
-- (EXPIRED). expires_at marks a hold; captured_amount is what its capture
-- moved (amount is what was held). A refund is a transfer from the payee
-- back to the payer whose refund_of names the transfer it refunds;
-- refunded_amount sums the refunds of a transfer that this region's ledger
-- decided (those of a same-region transfer: the payee's region decides).
ALTER TABLE transfers DROP CONSTRAINT transfers_status_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_status_check
    CHECK (status IN ('PENDING', 'HELD', 'DEBITED', 'COMPLETED', 'REFUNDED', 'REJECTED', 'VOIDED', 'EXPIRED'));
ALTER TABLE transfers DROP CONSTRAINT transfers_type_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_type_check CHECK (type IN ('transfer', 'fund', 'refund'));
-- A refund asked for "all that is left" when nothing is left is recorded
-- REJECTED with no amount.
ALTER TABLE transfers DROP CONSTRAINT transfers_amount_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_amount_check CHECK (amount > 0 OR (type = 'refund' AND status = 'REJECTED' AND amount = 0));
ALTER TABLE transfers ADD COLUMN expires_at timestamptz;
ALTER TABLE transfers ADD COLUMN captured_amount bigint;
ALTER TABLE transfers ADD COLUMN refund_of text COLLATE "C";
ALTER TABLE transfers ADD COLUMN refunded_amount bigint NOT NULL DEFAULT 0;
ALTER TABLE transfers ADD CONSTRAINT transfers_hold_check CHECK (
    (status IN ('HELD', 'VOIDED', 'EXPIRED') AND expires_at IS NOT NULL AND captured_amount IS NULL)
    OR (status NOT IN ('HELD', 'VOIDED', 'EXPIRED')
        AND (captured_amount IS NULL OR (expires_at IS NOT NULL AND captured_amount > 0 AND captured_amount <= amount))));
ALTER TABLE transfers ADD CONSTRAINT transfers_refunded_check
    CHECK (refunded_amount >= 0 AND refunded_amount <= coalesce(captured_amount, amount));
ALTER TABLE transfers ADD CONSTRAINT transfers_refund_check CHECK ((type = 'refund') = (refund_of IS NOT NULL));
CREATE INDEX transfers_refund_of ON transfers (refund_of) WHERE refund_of IS NOT NULL;
CREATE INDEX transfers_held ON transfers (from_account) WHERE status = 'HELD';

-- The destination region's record of a cross-region credit also sums the
-- refunds this region decided against it (the payee is here), and a credit
-- of a refund names the transfer it refunds.
ALTER TABLE credits ADD COLUMN refund_of text COLLATE "C";
ALTER TABLE credits ADD COLUMN refunded_amount bigint NOT NULL DEFAULT 0;
ALTER TABLE credits ADD CONSTRAINT credits_refunded_check CHECK (refunded_amount >= 0 AND refunded_amount <= amount);
CREATE INDEX credits_refund_of ON credits (refund_of) WHERE refund_of IS NOT NULL;

-- Captures and voids: one row per client request (its idempotency key, the
-- business key of the action), with its outcome: the capture or void that
-- won (APPLIED), or the reason it was refused (REJECTED).
CREATE TABLE transfer_actions (
    client_id       text COLLATE "C" NOT NULL,
    idempotency_key text COLLATE "C" NOT NULL,
    fingerprint     bytea NOT NULL,
    transfer_id     text COLLATE "C" NOT NULL,
    type            text NOT NULL CHECK (type IN ('capture', 'void')),
    amount          bigint NOT NULL CHECK (amount >= 0),
    status          text NOT NULL CHECK (status IN ('APPLIED', 'REJECTED')),
    reason          text,
    created_at      timestamptz NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client_id, idempotency_key),
    CHECK ((status = 'REJECTED') = (reason IS NOT NULL))
);
-- At most one capture or void of a transfer applies.
CREATE UNIQUE INDEX transfer_actions_applied ON transfer_actions (transfer_id) WHERE status = 'APPLIED';

-- A saga step may wait in the outbox until due_at: a hold's expiry. The
-- relay sends it once due; the capture or void of the hold deletes it.
ALTER TABLE outbox ADD COLUMN due_at timestamptz;
DROP INDEX outbox_unsent;
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL AND due_at IS NULL;
CREATE INDEX outbox_due ON outbox (due_at) WHERE sent_at IS NULL AND due_at IS NOT NULL;

-- +goose Down
DROP INDEX outbox_due;
DROP INDEX outbox_unsent;
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
ALTER TABLE outbox DROP COLUMN due_at;
DROP TABLE transfer_actions;
ALTER TABLE credits DROP COLUMN refunded_amount, DROP COLUMN refund_of;
DROP INDEX transfers_held;
ALTER TABLE transfers DROP CONSTRAINT transfers_refund_check, DROP CONSTRAINT transfers_refunded_check, DROP CONSTRAINT transfers_hold_check;
ALTER TABLE transfers DROP COLUMN refunded_amount, DROP COLUMN refund_of, DROP COLUMN captured_amount, DROP COLUMN expires_at;
ALTER TABLE transfers DROP CONSTRAINT transfers_type_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_type_check CHECK (type IN ('transfer', 'fund'));
ALTER TABLE transfers DROP CONSTRAINT transfers_amount_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_amount_check CHECK (amount > 0);
ALTER TABLE transfers DROP CONSTRAINT transfers_status_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_status_check CHECK (status IN ('PENDING', 'DEBITED', 'COMPLETED', 'REFUNDED', 'REJECTED'));
ALTER TABLE accounts DROP CONSTRAINT accounts_held_check;
ALTER TABLE accounts DROP COLUMN held;
