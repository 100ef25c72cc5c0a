-- +goose Up
-- The dead-letter audit: one row per operator action on a dead letter of
-- DLQ_<R> (its stream sequence), who did it, when, why and what came of it.
-- A dead letter is discarded at most once (the partial unique index), so a
-- discard run twice, or from two terminals, records one row; every replay
-- is recorded (the ledger's dedup layers make a repeated replay harmless).
CREATE TABLE dlq_audit (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dlq_seq    bigint NOT NULL CHECK (dlq_seq > 0),
    action     text NOT NULL CHECK (action IN ('replay', 'discard')),
    operator   text NOT NULL CHECK (operator <> ''),
    why        text NOT NULL,
    msg_key    text NOT NULL,
    dlq_reason text NOT NULL,
    outcome    text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX dlq_audit_one_discard ON dlq_audit (dlq_seq) WHERE action = 'discard';
CREATE INDEX dlq_audit_seq ON dlq_audit (dlq_seq);

-- +goose Down
DROP TABLE dlq_audit;
