package bench

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// ReadsRun is the reads scenario: what a ledger's users read, timed on a
// region holding ReadTransfers transfers, through the store's own methods
// (the SQL the API's reads run), with the plan of each read.
type ReadsRun struct {
	Transfers   int64   `json:"transfers"` // loaded (the accounts' funding aside)
	Postings    int64   `json:"postings"`
	Accounts    int     `json:"accounts"`
	Days        int     `json:"days"` // the loaded transfers' created_at spans this many days up to now
	LoadSeconds float64 `json:"load_seconds"`
	// SizeMB is the transfers and postings tables with their indexes.
	SizeMB       float64 `json:"size_mb"`
	Reads        []Read  `json:"reads"`
	Verified     bool    `json:"verified"`
	VerifyReport string  `json:"verify_report,omitempty"`
}

// Read is one kind of read, run Runs times with parameters drawn anew each
// time.
type Read struct {
	Name  string  `json:"name"`
	What  string  `json:"what"`
	Runs  int     `json:"runs"`
	Rows  float64 `json:"rows"` // answered per run, on average
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// Plan is what auto_explain wrote for the statements of one more run,
	// after the plan cache had settled (EXPLAIN ANALYZE, BUFFERS); empty
	// when the server could not load auto_explain.
	Plan string `json:"plan,omitempty"`
	// SeqScans names the tables that Plan scans in full.
	SeqScans []string `json:"seq_scans,omitempty"`
}

func (r ReadsRun) line() string {
	var parts []string
	for _, x := range r.Reads {
		parts = append(parts, fmt.Sprintf("%s p50 %.2f/p99 %.2f ms", x.Name, x.P50Ms, x.P99Ms))
	}
	return fmt.Sprintf("%-13s %d transfers (loaded in %.0fs, %.0f MB): %s  %s", Reads, r.Transfers, r.LoadSeconds, r.SizeMB,
		strings.Join(parts, ", "), invariants(r.Verified, r.VerifyReport))
}

// readsChunk is how many transfers one load transaction writes.
const readsChunk = 250_000

// readsDays is how far back the loaded transfers go.
const readsDays = 90

// reads loads a region's database with ReadTransfers transfers between the
// bench's accounts and times the reads of the API on it: the newest page of
// a client's transfers, a page deep under a cursor, an account's page, a
// reference, a metadata match, the account list, a balance as of an
// instant and a month's statement.
func (e *env) reads(ctx context.Context) (ReadsRun, error) {
	db, err := e.openRegionDB(ctx, Reads, e.regGens[region][0])
	if err != nil {
		return ReadsRun{}, err
	}
	defer db.close(ctx)
	pool, store, accounts := db.pool, db.store, db.accounts
	res := ReadsRun{Accounts: e.cfg.Accounts, Days: readsDays}
	l := readsLoad{n: int64(e.cfg.ReadTransfers), accounts: accounts, end: time.Now().Add(-time.Minute).Truncate(time.Second), horizon: db.log.Horizon()}
	l.start = l.end.Add(-readsDays * 24 * time.Hour)
	started := time.Now()
	if err := e.loadReads(ctx, pool, l); err != nil {
		return res, err
	}
	res.LoadSeconds = time.Since(started).Seconds()
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM transfers WHERE client_id = $1), (SELECT count(*) FROM postings),
		(pg_total_relation_size('transfers') + pg_total_relation_size('postings')) / 1e6`, Client).Scan(&res.Transfers, &res.Postings, &res.SizeMB); err != nil {
		return res, err
	}
	rep, err := store.Verify(ctx)
	if err != nil {
		return res, err
	}
	res.Verified = rep.OK() && res.Transfers == l.n
	if !res.Verified {
		res.VerifyReport = fmt.Sprintf("%d transfers loaded, want %d\n%s", res.Transfers, l.n, rep)
	}
	e.checkpoint(ctx)
	res.Reads, err = e.timeReads(ctx, db.url, store, l)
	return res, err
}

// readsLoad is what the load wrote: transfer n (0 ≤ n < n) was created at
// start + n·(end−start)/n between two of accounts.
type readsLoad struct {
	n          int64
	accounts   []string
	start, end time.Time
	horizon    time.Time // the consume-log's oldest day
}

func (l readsLoad) step() time.Duration {
	return (l.end.Sub(l.start) / time.Duration(max(l.n, 1))).Truncate(time.Microsecond)
}
func (l readsLoad) at(n int64) time.Time { return l.start.Add(time.Duration(n) * l.step()) }
func (l readsLoad) id(n int64) string    { return fmt.Sprintf("%s-%013x", region, n) }

// loadReadsSQL writes one chunk of the reads scenario's transfers, in
// created_at order as they arrive, and their change-log rows, set-based on
// the server: each transfer moves 1 to 1,000 cents between two accounts
// drawn by hashing n; one in a hundred is REJECTED (no change-log rows);
// one in ten has a reference and metadata. The transfers of the days the
// consume-log keeps have its rows, as the ledger writes them. An account's change-log rows
// continue its version and running balance, and the accounts take the
// chunk's sums.
var loadReadsSQL = []struct {
	sql  string
	args func(l readsLoad, lo, hi int64) []any
}{
	{`CREATE TEMP TABLE chunk ON COMMIT DROP AS
	 SELECT n, $6 || '-' || lpad(to_hex(n), 13, '0') AS id, $4::timestamptz + n * ($5::bigint * interval '1 microsecond') AS at,
	        ($1::text[])[1 + f] AS from_account,
	        ($1::text[])[1 + (f + 1 + n * 40503 % (cardinality($1::text[]) - 1)) % cardinality($1::text[])] AS to_account,
	        1 + n * 7919 % 1000 AS amount, CASE WHEN n % 100 = 7 THEN 'REJECTED' ELSE 'COMPLETED' END AS status
	 FROM generate_series($2::bigint, $3::bigint - 1) n,
	      LATERAL (SELECT (n * 2654435761 % 4294967291 % cardinality($1::text[]))::int AS f) h`,
		func(l readsLoad, lo, hi int64) []any {
			return []any{l.accounts, lo, hi, l.start, l.step().Microseconds(), region}
		}},
	{`INSERT INTO transfers (id, client_id, idempotency_key, fingerprint, type, from_account, to_account, amount, currency, status, reason,
	                        version, created_at, applied_at, reference, metadata)
	 SELECT id, $1, 'load-' || n, sha256(int8send(n)), 'transfer', from_account, to_account, amount, 'EUR', status,
	        CASE WHEN status = 'REJECTED' THEN 'insufficient_funds' END, 1, at, at,
	        CASE WHEN n % 10 = 0 THEN 'order-' || n END, CASE WHEN n % 10 = 0 THEN jsonb_build_object('order', 'o-' || n / 10) END
	 FROM chunk ORDER BY n`,
		func(readsLoad, int64, int64) []any { return []any{Client} }},
	{`INSERT INTO dedup_log (consumer, msg_key, origin_day, status, fence, holder, lease_until, fingerprint, claimed_at, processed_at)
	 SELECT $1, 'xfer/' || $2 || '/load-' || n, (at AT TIME ZONE 'UTC')::date, 'PROCESSED', 1, $4, at, sha256(int8send(n)), at, at
	 FROM chunk WHERE at >= $3 ORDER BY n`,
		func(l readsLoad, _, _ int64) []any {
			return []any{postgres.Consumer, Client, l.horizon, "bench-" + Reads}
		}},
	{`CREATE TEMP TABLE legs ON COMMIT DROP AS
	 SELECT c.id AS transfer_id, l.leg, l.account_id, l.amount, c.at, c.n
	 FROM chunk c, LATERAL (VALUES ('debit', c.from_account, -c.amount), ('credit', c.to_account, c.amount)) l(leg, account_id, amount)
	 WHERE c.status = 'COMPLETED'`, nil},
	{`INSERT INTO postings (transfer_id, leg, account_id, amount, balance_after, account_version, created_at)
	 SELECT l.transfer_id, l.leg, l.account_id, l.amount, a.balance + sum(l.amount) OVER w, a.version + row_number() OVER w, l.at
	 FROM legs l JOIN accounts a ON a.id = l.account_id
	 WINDOW w AS (PARTITION BY l.account_id ORDER BY l.n, l.leg DESC ROWS UNBOUNDED PRECEDING)
	 ORDER BY l.n, l.leg DESC`, nil},
	{`UPDATE accounts a SET balance = a.balance + s.total, version = a.version + s.rows
	 FROM (SELECT account_id, sum(amount) AS total, count(*) AS rows FROM legs GROUP BY account_id) s WHERE a.id = s.account_id`, nil},
}

// loadReads writes the scenario's transfers, readsChunk a transaction,
// then VACUUM ANALYZEs the tables as autovacuum would have by then. The
// accounts' funding is moved back before the span first, so that every
// account's change-log stays in time order.
func (e *env) loadReads(ctx context.Context, pool *pgxpool.Pool, l readsLoad) error {
	before := l.start.Add(-time.Hour)
	if _, err := pool.Exec(ctx, `UPDATE postings SET created_at = $1`, before); err != nil {
		return fmt.Errorf("date the funding: %w", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE transfers SET created_at = $1, applied_at = $1`, before); err != nil {
		return fmt.Errorf("date the funding: %w", err)
	}
	var done atomic.Int64
	stop := e.progress(Reads+" load", func() (int64, int64) { return done.Load(), l.n })
	defer stop()
	for lo := int64(0); lo < l.n; lo += readsChunk {
		hi := min(lo+readsChunk, l.n)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i, st := range loadReadsSQL {
				var args []any
				if st.args != nil {
					args = st.args(l, lo, hi)
				}
				if _, err := tx.Exec(ctx, st.sql, args...); err != nil {
					return fmt.Errorf("load transfers %d-%d (statement %d): %w", lo, hi, i+1, err)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		done.Store(hi)
	}
	for _, t := range []string{"transfers", "postings", "accounts"} {
		if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+t); err != nil {
			return fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	return nil
}

// readKind is one read of the scenario: run draws its parameters and
// returns how many rows it answered.
type readKind struct {
	name, what string
	run        func(ctx context.Context, s *postgres.Store) (int, error)
}

func (e *env) readKinds(l readsLoad) []readKind {
	n := func() int64 { return int64(e.rng.IntN(int(max(l.n, 1)))) }
	account := func() string { return l.accounts[e.rng.IntN(len(l.accounts))] }
	const page = 21 // the API's default page and one more, to know there is a next
	list := func(f ledger.TransferFilter) func(context.Context, *postgres.Store) (int, error) {
		return func(ctx context.Context, s *postgres.Store) (int, error) {
			f := f
			f.ClientID = Client
			switch {
			case f.After != nil:
				m := n()
				f.After = &ledger.ListCursor{CreatedAt: l.at(m), ID: l.id(m)}
			case f.Account != "":
				f.Account = account()
			case f.Reference != "":
				f.Reference = fmt.Sprintf("order-%d", n()/10*10)
			case f.Metadata != nil:
				f.Metadata = map[string]string{"order": fmt.Sprintf("o-%d", n()/10)}
			}
			ts, err := s.TransfersPage(ctx, f, page)
			return len(ts), err
		}
	}
	return []readKind{
		{"first-page", "the newest page of the client's transfers", list(ledger.TransferFilter{})},
		{"cursor-page", "a page under a cursor drawn over the whole span", list(ledger.TransferFilter{After: &ledger.ListCursor{}})},
		{"account-page", "the newest page of an account's transfers", list(ledger.TransferFilter{Account: "?"})},
		{"reference", "the transfers with a reference", list(ledger.TransferFilter{Reference: "?"})},
		{"metadata", "the transfers whose metadata has a key's value", list(ledger.TransferFilter{Metadata: map[string]string{}})},
		{"accounts-page", "the newest page of the client's accounts", func(ctx context.Context, s *postgres.Store) (int, error) {
			as, err := s.AccountsPage(ctx, ledger.AccountFilter{ClientID: Client}, page)
			return len(as), err
		}},
		{"as-of", "an account's balance and holds at an instant", func(ctx context.Context, s *postgres.Store) (int, error) {
			_, err := s.BalanceAt(ctx, account(), l.at(n()))
			return 1, err
		}},
		{"statement", "an account's statement of a month: opening, closing, the first page of entries", func(ctx context.Context, s *postgres.Store) (int, error) {
			from := l.at(n())
			st, err := s.Statement(ctx, account(), from, from.AddDate(0, 1, 0), 0, 101)
			return len(st.Entries), err
		}},
	}
}

// timeReads runs every read ReadRuns times on the store, then, on a pool
// whose sessions load auto_explain, planRuns more times to settle the plan
// cache as the timed pool's was, and once more to keep its plans.
func (e *env) timeReads(ctx context.Context, url string, store *postgres.Store, l readsLoad) ([]Read, error) {
	ex, err := openExplained(ctx, url)
	if err != nil {
		return nil, err
	}
	defer ex.pool.Close()
	explained := postgres.New(ex.pool, postgres.Config{Region: region, Regions: e.regions})
	var out []Read
	for _, k := range e.readKinds(l) {
		r := Read{Name: k.name, What: k.what, Runs: e.cfg.ReadRuns}
		took := make([]time.Duration, 0, r.Runs)
		rows := 0
		for range r.Runs {
			t0 := time.Now()
			n, err := k.run(ctx, store)
			if err != nil {
				return out, fmt.Errorf("%s: %s: %w", Reads, k.name, err)
			}
			took = append(took, time.Since(t0))
			rows += n
		}
		slices.Sort(took)
		r.P50Ms, r.P99Ms, r.Rows = ms(percentile(took, 0.5)), ms(percentile(took, 0.99)), float64(rows)/float64(r.Runs)
		if r.Plan, err = ex.plan(ctx, func() error { _, err := k.run(ctx, explained); return err }); err != nil {
			return out, fmt.Errorf("%s: %s: plan: %w", Reads, k.name, err)
		}
		r.SeqScans = seqScans(r.Plan)
		out = append(out, r)
		fmt.Fprintf(e.out, "  %-16s p50 %.2f ms  p99 %.2f ms  %.1f rows  %s\n", k.name, r.P50Ms, r.P99Ms, r.Rows, scanVerdict(r))
	}
	return out, nil
}

func scanVerdict(r Read) string {
	switch {
	case r.Plan == "":
		return "(no plan: auto_explain not loaded)"
	case len(r.SeqScans) > 0:
		return "SEQUENTIAL SCAN of " + strings.Join(r.SeqScans, ", ")
	}
	return "no sequential scan"
}

// planRuns is how many runs settle a prepared statement's plan: Postgres
// weighs a generic plan from the sixth execution on.
const planRuns = 6

// explained is a pool of one session that loaded auto_explain, whose
// plans arrive as notices while capturing.
type explained struct {
	pool      *pgxpool.Pool
	loaded    bool
	mu        sync.Mutex
	capturing bool
	plans     []string
}

func openExplained(ctx context.Context, url string) (*explained, error) {
	ex := &explained{}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		ex.mu.Lock()
		defer ex.mu.Unlock()
		if ex.capturing && strings.Contains(n.Message, "plan:") {
			ex.plans = append(ex.plans, n.Message)
		}
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		// LOAD needs a superuser (or auto_explain in $libdir/plugins);
		// without it the reads are timed and their plans left out.
		if _, err := c.Exec(ctx, `LOAD 'auto_explain'`); err != nil {
			return nil
		}
		ex.mu.Lock()
		ex.loaded = true
		ex.mu.Unlock()
		_, err := c.Exec(ctx, `SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
			SET auto_explain.log_buffers = on; SET auto_explain.log_level = notice; SET auto_explain.log_format = text`)
		return err
	}
	if ex.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if err := ex.pool.Ping(ctx); err != nil {
		ex.pool.Close()
		return nil, err
	}
	return ex, nil
}

// plan runs read planRuns times, then once more capturing its plans.
func (ex *explained) plan(ctx context.Context, read func() error) (string, error) {
	for range planRuns {
		if err := read(); err != nil {
			return "", err
		}
	}
	ex.mu.Lock()
	ex.capturing, ex.plans = true, nil
	ex.mu.Unlock()
	err := read()
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.capturing = false
	if err != nil || !ex.loaded {
		return "", err
	}
	return strings.Join(ex.plans, "\n"), nil
}

var seqScanRE = regexp.MustCompile(`Seq Scan on (\w+)`)

// seqScans names the tables a plan scans in full, each once.
func seqScans(plan string) []string {
	var out []string
	for _, m := range seqScanRE.FindAllStringSubmatch(plan, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}
