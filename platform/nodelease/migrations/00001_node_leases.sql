-- +goose Up
-- One row per machine id (region, node) of pkg/idgen. A process holds the
-- row while lease_until is ahead of the database's clock and it renews it;
-- token tells its renewals from a later holder's. high_water is the time
-- no ID of this machine id has reached or will reach while the row is held
-- (the holder's clock): the next holder mints only after it.
CREATE TABLE node_leases (
    region      text COLLATE "C" NOT NULL,
    node        int NOT NULL CHECK (node BETWEEN 0 AND 1023),
    holder      text NOT NULL,
    token       text NOT NULL,
    lease_until timestamptz NOT NULL,
    high_water  timestamptz NOT NULL, -- 'epoch' for a node never minted on
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (region, node)
);

-- +goose Down
DROP TABLE node_leases;
