-- +goose Up
-- The consume-log: one row per (consumer group, message key). It is
-- range-partitioned by the message's origin day, a value every redelivery of
-- a message carries unchanged, so the primary key still makes each key unique
-- within its partition. The retention job (dedup.Log.Maintain) creates the
-- partitions ahead of time and drops the expired ones.
CREATE TABLE dedup_log (
    consumer     text COLLATE "C" NOT NULL,
    msg_key      text COLLATE "C" NOT NULL,
    origin_day   date NOT NULL,
    status       text NOT NULL CHECK (status IN ('PROCESSING', 'PROCESSED')),
    fence        bigint NOT NULL CHECK (fence > 0),
    holder       text NOT NULL,
    lease_until  timestamptz NOT NULL,
    fingerprint  bytea,
    claimed_at   timestamptz NOT NULL,
    processed_at timestamptz,
    PRIMARY KEY (consumer, msg_key, origin_day)
) PARTITION BY RANGE (origin_day);

-- +goose Down
DROP TABLE dedup_log;
