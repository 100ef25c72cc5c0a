package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TPCBResult is the TPC-B baseline.
type TPCBResult struct {
	Tool    string  `json:"tool"` // "pgbench" or "go" (pgbench not installed)
	Scale   int     `json:"scale"`
	Clients int     `json:"clients"`
	Seconds float64 `json:"seconds"`
	TPS     float64 `json:"tps"`
}

// tpcbClients is how many TPC-B sessions run at once (pgbench -c 8 -j 2).
const tpcbClients = 8

// tpcb measures TPC-B on a database of its own: pgbench when it is
// installed, else a small Go equivalent of pgbench's built-in script.
func (e *env) tpcb(ctx context.Context) (TPCBResult, error) {
	db := e.cfg.DatabasePrefix + "tpcb"
	url, err := e.createDB(ctx, db)
	if err != nil {
		return TPCBResult{}, err
	}
	defer e.dropDB(ctx, db)
	res := TPCBResult{Scale: e.cfg.PgbenchScale, Clients: tpcbClients, Seconds: e.cfg.PgbenchFor.Seconds()}
	stop := e.progress(TPCB, func() (int64, int64) { return -1, 0 })
	defer stop()
	if path, err := exec.LookPath("pgbench"); err == nil {
		res.Tool = "pgbench"
		res.TPS, err = pgbench(ctx, path, url, e.cfg.PgbenchScale, e.cfg.PgbenchFor)
		return res, err
	}
	res.Tool = "go"
	res.TPS, err = goTPCB(ctx, url, e.cfg.PgbenchScale, e.cfg.PgbenchFor)
	return res, err
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// pgbench initialises scale and runs the built-in TPC-B-like script with 8
// clients on 2 threads, and returns its tps.
func pgbench(ctx context.Context, path, url string, scale int, d time.Duration) (float64, error) {
	if out, err := exec.CommandContext(ctx, path, "-i", "-q", "-s", strconv.Itoa(scale), url).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("pgbench -i: %v: %s", err, out)
	}
	secs := strconv.Itoa(max(1, int(d.Seconds())))
	out, err := exec.CommandContext(ctx, path, "-c", strconv.Itoa(tpcbClients), "-j", "2", "-T", secs, url).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %v: %s", err, out)
	}
	m := tpsRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench: no tps in its output: %s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// goTPCB is pgbench's schema and TPC-B-like transaction in Go.
func goTPCB(ctx context.Context, url string, scale int, d time.Duration) (float64, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	for _, sql := range []string{
		`CREATE TABLE tpcb_branches (bid int PRIMARY KEY, bbalance int NOT NULL, filler char(88))`,
		`CREATE TABLE tpcb_tellers (tid int PRIMARY KEY, bid int NOT NULL, tbalance int NOT NULL, filler char(84))`,
		`CREATE TABLE tpcb_accounts (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84))`,
		`CREATE TABLE tpcb_history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22))`,
		fmt.Sprintf(`INSERT INTO tpcb_branches SELECT b, 0 FROM generate_series(1, %d) b`, scale),
		fmt.Sprintf(`INSERT INTO tpcb_tellers SELECT t, (t-1)/10+1, 0 FROM generate_series(1, %d) t`, 10*scale),
		fmt.Sprintf(`INSERT INTO tpcb_accounts SELECT a, (a-1)/100000+1, 0, '' FROM generate_series(1, %d) a`, 100_000*scale),
		`VACUUM ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return 0, fmt.Errorf("tpcb init: %w", err)
		}
	}
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, tpcbClients)
	start := time.Now()
	deadline := start.Add(d)
	for c := range tpcbClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				aid, tid, bid, delta := 1+rng.IntN(100_000*scale), 1+rng.IntN(10*scale), 1+rng.IntN(scale), rng.IntN(10001)-5000
				// One statement at a time, as pgbench's script sends them.
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for _, q := range []struct {
						sql  string
						args []any
					}{
						{`UPDATE tpcb_accounts SET abalance = abalance + $1 WHERE aid = $2`, []any{delta, aid}},
						{`SELECT abalance FROM tpcb_accounts WHERE aid = $1`, []any{aid}},
						{`UPDATE tpcb_tellers SET tbalance = tbalance + $1 WHERE tid = $2`, []any{delta, tid}},
						{`UPDATE tpcb_branches SET bbalance = bbalance + $1 WHERE bid = $2`, []any{delta, bid}},
						{`INSERT INTO tpcb_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, now())`, []any{tid, bid, aid, delta}},
					} {
						if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
							return err
						}
					}
					return nil
				})
				var pgErr interface{ SQLState() string }
				if errors.As(err, &pgErr) && pgErr.SQLState() == "40P01" {
					continue // a deadlock between two branch updates: pgbench would count it as failed
				}
				if err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("tpcb: %w", err)
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}
