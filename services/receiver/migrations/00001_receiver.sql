-- +goose Up
-- The receiver's inbox: each account's next expected event, and every event
-- received, applied or parked until the events before it arrive. An event's
-- ID is recorded in the transaction of its effect, so an effect and the
-- record that it happened commit together or not at all.
CREATE TABLE receiver_accounts (
    account       text        PRIMARY KEY,
    next_sequence bigint      NOT NULL DEFAULT 1,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE receiver_events (
    event_id    text        PRIMARY KEY,
    account     text        NOT NULL,
    sequence    bigint      NOT NULL CHECK (sequence > 0),
    type        text        NOT NULL,
    state       text        NOT NULL CHECK (state IN ('parked', 'applied')),
    -- The attempt and redelivery numbers of the delivery that brought it
    -- (0: not said), to name the cause of a duplicate.
    attempt     int         NOT NULL DEFAULT 0,
    redelivery  int         NOT NULL DEFAULT 0,
    received_at timestamptz NOT NULL DEFAULT now(),
    applied_at  timestamptz,
    -- A parked event's body, until it is applied.
    body        jsonb,
    UNIQUE (account, sequence)
);
CREATE INDEX receiver_events_parked ON receiver_events (account, sequence) WHERE state = 'parked';

-- Every duplicate received, with its cause: nothing was applied for it.
CREATE TABLE receiver_duplicates (
    event_id    text        NOT NULL,
    cause       text        NOT NULL,
    attempt     int         NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX receiver_duplicates_event ON receiver_duplicates (event_id);

-- The toy shop whose state the events change (Orders): an order per
-- transfer, paid, cancelled or refunded, and the accounts' states. events
-- counts the events applied to a row, so that an effect applied twice shows.
CREATE TABLE orders (
    transfer_id text        PRIMARY KEY,
    account     text,
    amount      bigint,
    currency    text,
    status      text        NOT NULL,
    refunded    bigint      NOT NULL DEFAULT 0,
    events      int         NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE customer_accounts (
    account    text        PRIMARY KEY,
    status     text        NOT NULL,
    events     int         NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE customer_accounts;
DROP TABLE orders;
DROP TABLE receiver_duplicates;
DROP TABLE receiver_events;
DROP TABLE receiver_accounts;
