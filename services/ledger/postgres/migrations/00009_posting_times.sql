-- +goose Up
-- A change-log row's time is when its statement ran, not when its
-- transaction began: statement_timestamp() instead of now(). An account's
-- rows then carry times in the order of their versions. A transaction that
-- writes version v+1 read version v, committed, before its insert
-- statement started, and v's insert ran before that commit; with now(), a
-- transaction that began before v's but read the account after v's commit
-- would stamp v+1 earlier than v. Balances at an instant and statements
-- read the change-log by these times (paymesh verify checks the order).
ALTER TABLE postings ALTER COLUMN created_at SET DEFAULT statement_timestamp();
-- Rows written before, with now(), may be out of that order: each is moved
-- up to the latest time of its account's rows before it, so that history
-- reads in order too (a row moves by at most the length of a transaction).
UPDATE postings p SET created_at = m.latest
FROM (SELECT transfer_id, leg, max(created_at) OVER (PARTITION BY account_id ORDER BY account_version) AS latest
      FROM postings) m
WHERE p.transfer_id = m.transfer_id AND p.leg = m.leg AND p.created_at < m.latest;

-- +goose Down
ALTER TABLE postings ALTER COLUMN created_at SET DEFAULT now();
