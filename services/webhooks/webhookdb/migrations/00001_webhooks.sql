-- +goose Up
-- A client's webhook endpoints, as this region holds them: the endpoint's
-- home region (its ID's) writes it and pushes each version to the others;
-- a copy is replaced only by a higher version. feed_* is this region's
-- position in the events table (services/ledger/postgres's feed order):
-- the events up to it are queued for the endpoint.
CREATE TABLE webhook_endpoints (
    id               text        PRIMARY KEY,
    client_id        text        NOT NULL,
    url              text        NOT NULL,
    types            text[]      NOT NULL DEFAULT '{}',
    secret           text        NOT NULL,
    previous_secret  text,
    previous_until   timestamptz,
    status           text        NOT NULL CHECK (status IN ('enabled', 'disabled', 'deleted')),
    disabled_reason  text,
    version          bigint      NOT NULL CHECK (version > 0),
    -- At the home region: the version every region has acknowledged.
    pushed_version   bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    -- At the home region: the create's Idempotency-Key and request.
    idempotency_key  text,
    request_hash     bytea,
    feed_tx          xid8        NOT NULL,
    feed_account     text        NOT NULL DEFAULT '',
    feed_sequence    bigint      NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX webhook_endpoints_key ON webhook_endpoints (client_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX webhook_endpoints_client ON webhook_endpoints (client_id, created_at DESC) WHERE status <> 'deleted';

-- One event's delivery to one endpoint. For one (endpoint, account), only
-- the pending delivery of the lowest sequence is sent: an account's events
-- reach an endpoint in order. attempts counts the claims; a claim holds the
-- delivery until leased_until, and only the claim whose number it holds
-- may end it.
CREATE TABLE webhook_deliveries (
    endpoint_id   text        NOT NULL,
    account_id    text        NOT NULL,
    sequence      bigint      NOT NULL,
    status        text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts      int         NOT NULL DEFAULT 0,
    next_at       timestamptz NOT NULL DEFAULT now(),
    leased_until  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    ended_at      timestamptz,
    last_error    text,
    PRIMARY KEY (endpoint_id, account_id, sequence)
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (endpoint_id, account_id, sequence) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_ended ON webhook_deliveries USING brin (ended_at);

-- Every attempt of a delivery: when, how long, and what came back.
CREATE TABLE webhook_attempts (
    endpoint_id  text        NOT NULL,
    account_id   text        NOT NULL,
    sequence     bigint      NOT NULL,
    attempt      int         NOT NULL,
    at           timestamptz NOT NULL,
    duration_us  bigint      NOT NULL,
    status_code  int         NOT NULL DEFAULT 0,
    error        text,
    PRIMARY KEY (endpoint_id, account_id, sequence, attempt)
);
CREATE INDEX webhook_attempts_at ON webhook_attempts (endpoint_id, at DESC);

-- +goose Down
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
