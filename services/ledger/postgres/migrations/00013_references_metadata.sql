-- +goose Up
-- A client's own reference (an order or payment ID) and metadata on its
-- transfers and accounts. A reference is unique per client among the
-- transfers of this region that were not refused (a refused one frees it,
-- so the client can try again), and among the client's accounts here: the
-- business key the client gives. Metadata is read by containment (@>)
-- through a GIN index on the rows that have any, so the rows without it
-- (every transfer before this migration, most after) cost the index
-- nothing.
ALTER TABLE transfers ADD COLUMN reference text COLLATE "C", ADD COLUMN metadata jsonb;
CREATE UNIQUE INDEX transfers_reference ON transfers (client_id, reference)
    WHERE reference IS NOT NULL AND status <> 'REJECTED';
CREATE INDEX transfers_metadata ON transfers USING gin (metadata jsonb_path_ops) WHERE metadata IS NOT NULL;
ALTER TABLE accounts ADD COLUMN reference text COLLATE "C", ADD COLUMN metadata jsonb;
CREATE UNIQUE INDEX accounts_reference ON accounts (client_id, reference) WHERE reference IS NOT NULL;
CREATE INDEX accounts_metadata ON accounts USING gin (metadata jsonb_path_ops) WHERE metadata IS NOT NULL;

-- +goose Down
DROP INDEX accounts_metadata;
DROP INDEX accounts_reference;
ALTER TABLE accounts DROP COLUMN metadata, DROP COLUMN reference;
DROP INDEX transfers_metadata;
DROP INDEX transfers_reference;
ALTER TABLE transfers DROP COLUMN metadata, DROP COLUMN reference;
