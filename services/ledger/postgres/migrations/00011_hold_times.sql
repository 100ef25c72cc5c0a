-- +goose Up
-- When a hold began and stopped reserving its amount, by the clock of the
-- statements that did it (as a change-log row's created_at): what an
-- account held at an instant is the sum of the holds open then. held_at is
-- set when a hold is recorded HELD (a refused hold never held anything),
-- released_at when it leaves HELD (captured, voided, expired).
ALTER TABLE transfers ADD COLUMN held_at timestamptz, ADD COLUMN released_at timestamptz;
-- Holds recorded before: from their creation to when they settled, as far
-- as that is known (a hold captured into another region settled at its
-- confirm; such a hold counts as released at its creation).
UPDATE transfers SET held_at = created_at,
       released_at = CASE WHEN status = 'HELD' THEN NULL ELSE coalesce(settled_at, created_at) END
WHERE expires_at IS NOT NULL AND status <> 'REJECTED';
CREATE INDEX transfers_holds ON transfers (from_account, held_at) WHERE held_at IS NOT NULL;

-- +goose Down
DROP INDEX transfers_holds;
ALTER TABLE transfers DROP COLUMN held_at, DROP COLUMN released_at;
