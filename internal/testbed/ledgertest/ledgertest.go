// Package ledgertest builds a ledger on a fresh Postgres database for tests:
// a store, its consume-log on a steppable clock, an ID generator, and
// helpers that open accounts, fund them and apply commands.
package ledgertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// FailBeforeCommit decorates a store's consume-log so that fail runs
// after its Release, the apply transaction's last statement: an error
// rolls the transaction back with all its writes done, as a crash just
// before COMMIT would; a slow fail holds the transaction open there.
func FailBeforeCommit(l postgres.ConsumeLog, fail func(ctx context.Context) error) postgres.ConsumeLog {
	return failBeforeCommit{ConsumeLog: l, fail: fail}
}

type failBeforeCommit struct {
	postgres.ConsumeLog
	fail func(ctx context.Context) error
}

func (l failBeforeCommit) Release(ctx context.Context, tx dedup.Querier, consumer string, claims []dedup.Claim) error {
	if err := l.ConsumeLog.Release(ctx, tx, consumer, claims); err != nil {
		return err
	}
	return l.fail(ctx)
}

// Fixture is one region's ledger database with a steppable clock.
type Fixture struct {
	Store   *postgres.Store
	Pool    *pgxpool.Pool
	URL     string
	Log     *dedup.Log
	IDs     *idgen.Generator
	Regions *idgen.Regions
	Stats   *ledger.Stats
	Clock   *Clock
}

// Clock is a steppable clock.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *Clock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// New builds a ledger on a fresh database; mods adjust its store config.
func New(tb testing.TB, mods ...func(*postgres.Config)) *Fixture {
	tb.Helper()
	pool, url := pgtest.MustDatabase(tb, postgres.Migrations()...)
	return On(tb, pool, url, mods...)
}

// On builds a ledger on an existing migrated database. Its region is eu
// unless a mod (see Region) says otherwise; every fixture mints IDs on a
// node of its own.
func On(tb testing.TB, pool *pgxpool.Pool, url string, mods ...func(*postgres.Config)) *Fixture {
	tb.Helper()
	regions, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2, "ap": 3})
	if err != nil {
		tb.Fatal(err)
	}
	f := &Fixture{Pool: pool, URL: url, Regions: regions, Stats: &ledger.Stats{}, Clock: &Clock{t: time.Now().UTC()}}
	node := uint16(nodes.Add(1) % idgen.MaxNode)
	f.Log = dedup.New(dedup.Config{Holder: fmt.Sprintf("test-%d-%d", node, time.Now().UnixNano()), WindowDays: 3, Now: f.Clock.Now})
	cfg := postgres.Config{Region: "eu", Regions: regions, Stats: f.Stats, Now: f.Clock.Now, Dedup: postgres.NewConsumeLog(f.Log)}
	for _, m := range mods {
		m(&cfg)
	}
	if f.IDs, err = idgen.NewGenerator(regions, cfg.Region, node); err != nil {
		tb.Fatal(err)
	}
	cfg.IDs = f.IDs
	f.Store = postgres.New(pool, cfg)
	if err := f.Store.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return f
}

// nodes hands every fixture of the process its own ID node.
var nodes atomic.Int64

// Region makes a fixture's ledger belong to region r.
func Region(r string) func(*postgres.Config) { return func(c *postgres.Config) { c.Region = r } }

// ID mints an ID in the fixture's region.
func (f *Fixture) ID(tb testing.TB) string {
	tb.Helper()
	s, err := f.IDs.NextString()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Account opens an account funded with funds through the issuance account.
func (f *Fixture) Account(tb testing.TB, currency string, funds int64) string {
	tb.Helper()
	a, _, err := f.Store.CreateAccount(context.Background(), ledger.NewAccount{ClientID: "c1", Currency: currency})
	if err != nil {
		tb.Fatal(err)
	}
	if funds > 0 {
		f.MustApply(tb, ledger.Command{Type: ledger.TypeFund, TransferID: f.ID(tb), ClientID: "c1",
			IdempotencyKey: "fund-" + a.ID, To: a.ID, Amount: funds, Currency: currency, CreatedAt: f.Clock.Now()})
	}
	return a.ID
}

// AccountAs opens a customer account under an ID already minted: an account
// that comes to exist after commands named it (restored from a backup, or
// imported with its ID). Accounts of the currency must exist already (for
// its issuance and transit accounts).
func (f *Fixture) AccountAs(tb testing.TB, id, currency string) {
	tb.Helper()
	if _, err := f.Pool.Exec(context.Background(), `INSERT INTO accounts (id, client_id, kind, currency, floor) VALUES ($1, 'c1', 'customer', $2, 0)`, id, currency); err != nil {
		tb.Fatalf("account %s: %v", id, err)
	}
}

// Transfer builds a EUR transfer command with fresh IDs and key.
func (f *Fixture) Transfer(tb testing.TB, from, to string, amount int64) ledger.Command {
	tb.Helper()
	return ledger.Command{Type: ledger.TypeTransfer, TransferID: f.ID(tb), ClientID: "c1", IdempotencyKey: "k-" + f.ID(tb),
		From: from, To: to, Amount: amount, Currency: "EUR", CreatedAt: f.Clock.Now()}
}

// Apply applies commands as one batch and counts the results.
func (f *Fixture) Apply(tb testing.TB, cmds ...ledger.Command) []ledger.Result {
	tb.Helper()
	rs, err := f.Store.Apply(context.Background(), cmds)
	if err != nil {
		tb.Fatalf("apply: %v", err)
	}
	for i, r := range rs {
		f.Stats.Record(cmds[i].Topic(), r)
	}
	return rs
}

// MustApply applies one command and fails unless it was applied.
func (f *Fixture) MustApply(tb testing.TB, c ledger.Command) ledger.Result {
	tb.Helper()
	r := f.Apply(tb, c)[0]
	if r.Kind != ledger.Applied {
		tb.Fatalf("apply %s: got %v %v, want applied", c, r.Kind, r.Err)
	}
	return r
}

// Balance returns an account balance.
func (f *Fixture) Balance(tb testing.TB, id string) int64 {
	tb.Helper()
	a, err := f.Store.Account(context.Background(), id)
	if err != nil {
		tb.Fatal(err)
	}
	return a.Balance
}

// MustVerify fails the test unless every invariant holds.
func (f *Fixture) MustVerify(tb testing.TB) {
	tb.Helper()
	rep, err := f.Store.Verify(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	if !rep.OK() {
		tb.Fatalf("verify failed:\n%s", rep)
	}
}

// Count runs a count query.
func (f *Fixture) Count(tb testing.TB, sql string, args ...any) int {
	tb.Helper()
	var n int
	if err := f.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}
