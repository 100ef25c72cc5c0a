-- +goose Up
-- Cross-region transfers run as a saga. The source region debits into its
-- transit account (hold) and queues a credit step in the outbox; the
-- destination region records the credit (or its refusal) and queues the
-- answer; the source region completes or refunds.
ALTER TABLE accounts DROP CONSTRAINT accounts_kind_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_kind_check CHECK (kind IN ('customer', 'issuance', 'transit'));
-- One transit account per currency in a region.
CREATE UNIQUE INDEX accounts_transit_currency ON accounts (currency) WHERE kind = 'transit';

-- A refunded transfer keeps the reason its credit was refused.
ALTER TABLE transfers DROP CONSTRAINT transfers_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_reason_check
    CHECK (CASE status WHEN 'REJECTED' THEN reason IS NOT NULL WHEN 'REFUNDED' THEN true ELSE reason IS NULL END);

ALTER TABLE postings DROP CONSTRAINT postings_leg_check;
ALTER TABLE postings ADD CONSTRAINT postings_leg_check
    CHECK (leg IN ('debit', 'credit', 'hold', 'release', 'refund', 'unhold'));

-- The destination region's record of each credit step: the business key
-- that makes a credit apply at most once.
CREATE TABLE credits (
    transfer_id  text COLLATE "C" PRIMARY KEY,
    from_account text COLLATE "C" NOT NULL,
    to_account   text COLLATE "C" NOT NULL,
    amount       bigint NOT NULL CHECK (amount > 0),
    currency     char(3) NOT NULL,
    status       text NOT NULL CHECK (status IN ('CREDITED', 'REFUSED')),
    reason       text,
    created_at   timestamptz NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'REFUSED') = (reason IS NOT NULL))
);

-- The transactional outbox: the next saga step, written in the transaction
-- of the step that causes it, relayed by the router, marked sent after the
-- destination stream acked it. msg_id is the step's Nats-Msg-Id.
CREATE TABLE outbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    msg_id      text COLLATE "C" NOT NULL UNIQUE,
    region      text NOT NULL,
    account     text COLLATE "C" NOT NULL,
    payload     bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz,
    attempts    int NOT NULL DEFAULT 0
);
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;

-- +goose Down
DROP TABLE outbox;
DROP TABLE credits;
ALTER TABLE postings DROP CONSTRAINT postings_leg_check;
ALTER TABLE postings ADD CONSTRAINT postings_leg_check CHECK (leg IN ('debit', 'credit', 'refund'));
ALTER TABLE transfers DROP CONSTRAINT transfers_reason_check;
ALTER TABLE transfers ADD CONSTRAINT transfers_check CHECK ((status = 'REJECTED') = (reason IS NOT NULL));
DROP INDEX accounts_transit_currency;
ALTER TABLE accounts DROP CONSTRAINT accounts_kind_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_kind_check CHECK (kind IN ('customer', 'issuance'));
