-- +goose Up
-- The events clients read in their feed and receive by webhook, written in
-- the transaction of the change they tell (services/ledger/postgres/events.go).
-- An event is known by its account and the account's sequence, which has no
-- gaps: event_sequences holds each account's last, taken under its row
-- lock. tx, the writing transaction, orders the feed: every event of a
-- transaction below the oldest one still running is visible, so a reader
-- that stops there never skips one that commits later.
CREATE TABLE event_sequences (
    account_id text PRIMARY KEY,
    last       bigint NOT NULL CHECK (last > 0)
);

CREATE TABLE events (
    account_id      text        NOT NULL,
    sequence        bigint      NOT NULL CHECK (sequence > 0),
    client_id       text        NOT NULL,
    type            text        NOT NULL,
    object_id       text        NOT NULL,
    -- The object's changed fields as they were: a transfer's status,
    -- reason, version and captured amount, or an account's state.
    status          text        NOT NULL,
    reason          text,
    version         bigint      NOT NULL DEFAULT 0,
    captured_amount bigint      NOT NULL DEFAULT 0,
    tx              xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- The time the row is made, after the counter's lock is taken: an
    -- account's events are in time order too, so retention, which
    -- deletes by time, never leaves a gap inside an account's sequence.
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (account_id, sequence)
);
-- A client's feed, in the order it is read.
CREATE INDEX events_client_feed ON events (client_id, tx, account_id, sequence);
-- Retention, by time: events are appended in time order, so a BRIN index
-- costs next to nothing to keep.
CREATE INDEX events_created ON events USING brin (created_at);

-- +goose Down
DROP TABLE events;
DROP TABLE event_sequences;
