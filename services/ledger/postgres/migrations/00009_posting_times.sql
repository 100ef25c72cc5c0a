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

-- +goose Down
ALTER TABLE postings ALTER COLUMN created_at SET DEFAULT now();
