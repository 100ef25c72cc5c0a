package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// openAccounts opens n customer accounts in a region's ledger and funds
// each with fundAmount. The first goes through CreateAccount, which also
// opens the region's issuance and transit accounts; the others are the same
// rows written in one statement. The funding goes through the ledger's own
// apply, 500 fund commands a transaction, so the funded money is in the
// change-log and every invariant holds.
func openAccounts(ctx context.Context, e *env, store *postgres.Store, region string, n int) ([]string, error) {
	first, _, err := store.CreateAccount(ctx, ledger.NewAccount{ClientID: Client, Currency: "EUR"})
	if err != nil {
		return nil, fmt.Errorf("open accounts: %w", err)
	}
	ids := []string{first.ID}
	for len(ids) < n {
		id, err := e.nextID(region)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if _, err := store.Pool().Exec(ctx, `
		INSERT INTO accounts (id, client_id, kind, currency, floor)
		SELECT id, $2, 'customer', 'EUR', 0 FROM unnest($1::text[]) AS id`, ids[1:], Client); err != nil {
		return nil, fmt.Errorf("open accounts: %w", err)
	}
	const perTx = 500
	for lo := 0; lo < len(ids); lo += perTx {
		var cmds []ledger.Command
		for _, id := range ids[lo:min(lo+perTx, len(ids))] {
			tid, err := e.nextID(region)
			if err != nil {
				return nil, err
			}
			cmds = append(cmds, ledger.Command{Type: ledger.TypeFund, TransferID: tid, ClientID: Client + "-ops",
				IdempotencyKey: "fund-" + id, To: id, Amount: fundAmount, Currency: "EUR", CreatedAt: time.Now()})
		}
		rs, err := store.Apply(ctx, cmds)
		if err != nil {
			return nil, fmt.Errorf("fund accounts: %w", err)
		}
		for _, r := range rs {
			if r.Kind != ledger.Applied {
				return nil, fmt.Errorf("fund accounts: %v %v", r.Kind, r.Err)
			}
		}
	}
	return ids, nil
}

// regionDB is a scenario's region database: created, migrated, and its
// accounts opened and funded. close drops it (unless Keep).
type regionDB struct {
	e        *env
	name     string
	url      string
	pool     *pgxpool.Pool
	store    *postgres.Store
	log      *dedup.Log
	accounts []string
}

// openRegionDB makes scenario's region database, its store minting account
// IDs from ids.
func (e *env) openRegionDB(ctx context.Context, scenario string, ids postgres.IDSource) (d *regionDB, err error) {
	d = &regionDB{e: e, name: e.cfg.DatabasePrefix + scenario}
	if d.url, err = e.createDB(ctx, d.name); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.close(ctx)
		}
	}()
	if d.pool, err = postgres.Connect(ctx, d.url, 30*time.Second, 0); err != nil {
		return d, err
	}
	d.log = dedup.New(dedup.Config{Holder: "bench-" + scenario})
	d.store = postgres.New(d.pool, postgres.Config{Region: region, IDs: ids, Regions: e.regions, Dedup: postgres.NewConsumeLog(d.log)})
	if err := d.store.Migrate(ctx); err != nil {
		return d, err
	}
	d.accounts, err = openAccounts(ctx, e, d.store, region, e.cfg.Accounts)
	return d, err
}

func (d *regionDB) close(ctx context.Context) {
	if d.pool != nil {
		d.pool.Close()
	}
	d.e.dropDB(ctx, d.name)
}

// fillHolder marks the consume-log rows the dedup-table scenario writes
// before its run.
const fillHolder = "bench-fill"

// fillDedup writes rows consume-log rows of the ledger's consumer group into
// today's partition (where the run's claims go, so each claim probes an
// index that holds them all), then ANALYZEs. Their keys look like the run's
// (xfer/<client>/<16 hex digits>…) and spread evenly over the same range, so
// the run's claims land among them in the index rather than after them.
// The keys are generated in index order, which keeps the insert fast.
func (e *env) fillDedup(ctx context.Context, rig *ledgerRig, rows int64) error {
	started := time.Now()
	stop := e.progress("dedup-table fill", func() (int64, int64) { return -1, rows })
	defer stop()
	day := time.Now().UTC().Truncate(24 * time.Hour)
	_, err := rig.srv.Store.Pool().Exec(ctx, `
		INSERT INTO dedup_log (consumer, msg_key, origin_day, status, fence, holder, lease_until, fingerprint, claimed_at, processed_at)
		SELECT $1, 'xfer/'||$2||'/' || lpad(to_hex(n * ($3::bigint / $4::bigint)), 16, '0'), $5::date, 'PROCESSED', 1, $6,
		       now(), sha256(int8send(n)), now(), now()
		FROM generate_series(1, $4::bigint) AS n`,
		postgres.Consumer, Client, int64(1<<63-1), rows, day, fillHolder)
	if err != nil {
		return fmt.Errorf("fill the consume-log: %w", err)
	}
	if _, err := rig.srv.Store.Pool().Exec(ctx, `ANALYZE dedup_log`); err != nil {
		return fmt.Errorf("analyze the consume-log: %w", err)
	}
	fmt.Fprintf(e.out, "dedup-table: %d consume-log rows written to %s and analyzed in %s\n",
		rows, dedup.PartitionName(day), time.Since(started).Round(100*time.Millisecond))
	return nil
}

// unfillDedup removes the fill rows again, so that Verify's consume-log
// check (every row names something applied) can run: the run's own rows
// are copied aside, the table truncated and they are put back. This
// happens after the measurement.
func (e *env) unfillDedup(ctx context.Context, rig *ledgerRig) error {
	return pgx.BeginFunc(ctx, rig.srv.Store.Pool(), func(tx pgx.Tx) error {
		for _, sql := range []string{
			`CREATE TEMP TABLE bench_keep ON COMMIT DROP AS SELECT * FROM dedup_log WHERE holder <> '` + fillHolder + `'`,
			`TRUNCATE dedup_log`,
			`INSERT INTO dedup_log SELECT * FROM bench_keep`,
		} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("remove the fill rows: %w", err)
			}
		}
		return nil
	})
}

// checkpoint asks Postgres to write out what the set-up dirtied, so that a
// measured run does not pay for an earlier one's checkpoint. It needs a
// superuser; without one the run starts anyway.
func (e *env) checkpoint(ctx context.Context) {
	conn, err := pgx.Connect(ctx, e.cfg.PostgresURL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, `CHECKPOINT`)
}
