package pgha_test

import (
	"context"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/lab/certs"
	"github.com/paymesh/paymesh/internal/testbed/pgha"
	"github.com/paymesh/paymesh/internal/testbed/pgha/pghatest"
)

// writer commits one row at a time through the formation's multi-host
// URL, and keeps the IDs whose COMMIT was answered OK.
type writer struct {
	pool              *pgxpool.Pool
	mu                sync.Mutex
	acked             []int64
	failed, attempted atomic.Int64
}

func (w *writer) run(ctx context.Context) {
	for id := int64(1); ctx.Err() == nil; id++ {
		w.attempted.Add(1)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := w.pool.Exec(wctx, `INSERT INTO acked (id) VALUES ($1)`, id)
		cancel()
		if err != nil {
			w.failed.Add(1)
			time.Sleep(20 * time.Millisecond)
			continue
		}
		w.mu.Lock()
		w.acked = append(w.acked, id)
		w.mu.Unlock()
	}
}

func (w *writer) ackedIDs() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.acked)
}

// waitAcked waits until n more commits than now were answered OK.
func (w *writer) waitAcked(t *testing.T, n int) {
	t.Helper()
	from := len(w.ackedIDs())
	deadline := time.Now().Add(2 * time.Minute)
	for len(w.ackedIDs()) < from+n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d commits: %d after 2 min (%d failed)", n, len(w.ackedIDs())-from, w.failed.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// missing returns the acknowledged IDs that node's table lacks.
func missing(ctx context.Context, url string, acked []int64) ([]int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT a FROM unnest($1::bigint[]) a WHERE NOT EXISTS (SELECT FROM acked WHERE id = a) ORDER BY a`, acked)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func startWriting(t *testing.T, f *pgha.Formation) (*writer, func()) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, f.URL("paymesh"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE acked (id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	w := &writer{pool: pool}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.run(wctx) })
	return w, func() { stop(); wg.Wait(); pool.Close() }
}

// TestFailover kills the primary of a formation (its keeper and every
// server process, SIGKILL) while a client commits through the multi-host
// URL: the standby is promoted, the client's pool finds it on its own and
// commits go on, and every commit answered OK before the kill is there.
// The killed node then comes back wiped and is made a standby again, and
// holds every acknowledged commit too.
func TestFailover(t *testing.T) {
	ctx := context.Background()
	f := pghatest.MustStart(t, pgha.Options{})
	old, err := f.Primary(ctx)
	if err != nil || old == nil {
		t.Fatalf("primary: %v, %v", old, err)
	}
	w, stop := startWriting(t, f)
	defer stop()
	w.waitAcked(t, 200)

	killed := time.Now()
	if err := f.Kill(old); err != nil {
		t.Fatal(err)
	}
	before := w.ackedIDs()
	p, err := f.WaitPrimary(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	w.waitAcked(t, 200)
	t.Logf("%s killed, %s took writes after %v; %d commits failed or cut off", old.Name, p.Name, time.Since(killed).Round(time.Millisecond), w.failed.Load())
	if lost, err := missing(ctx, p.NodeURL("paymesh"), before); err != nil || len(lost) > 0 {
		t.Fatalf("the new primary lacks %d commits acknowledged before the kill: %v (%v)", len(lost), lost, err)
	}

	if err := f.Rejoin(ctx, old); err != nil {
		t.Fatal(err)
	}
	w.waitAcked(t, 100)
	stop()
	acked := w.ackedIDs()
	for _, n := range f.Nodes {
		// The standby replays what it has received: wait until it holds
		// every commit (a synchronous standby has them all on disk).
		deadline := time.Now().Add(time.Minute)
		for {
			lost, err := missing(ctx, n.NodeURL("paymesh"), acked)
			if err == nil && len(lost) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s lacks %d acknowledged commits (%v)", n.Name, len(lost), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if states, err := f.States(ctx); err != nil || len(states) != 2 {
		t.Fatalf("states after the rejoin: %+v (%v)", states, err)
	}
}

// TestAsyncStandbyLosesCommits is why the formation's standby is
// synchronous: taken out of the write quorum, it is asynchronous, and
// commits answered while it lags are lost when the primary dies. The same
// lag with the standby synchronous (TestFailover's setting) holds every
// commit back until the standby has it, so none answered is lost.
func TestAsyncStandbyLosesCommits(t *testing.T) {
	pghatest.Require(t)
	ctx := context.Background()
	for _, async := range []bool{false, true} {
		name := map[bool]string{false: "Synchronous", true: "Asynchronous"}[async]
		t.Run(name, func(t *testing.T) {
			f := pghatest.MustStart(t, pgha.Options{})
			old, _ := f.Primary(ctx)
			standby := f.Nodes[0]
			if standby == old {
				standby = f.Nodes[1]
			}
			if async {
				if err := f.SetQuorum(ctx, standby, false); err != nil {
					t.Fatal(err)
				}
				if err := old.WaitSetting(ctx, "synchronous_standby_names", ""); err != nil {
					t.Fatal(err)
				}
			}
			w, stop := startWriting(t, f)
			defer stop()
			w.waitAcked(t, 50)
			resume, err := old.PauseReplication(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// While the primary sends nothing: the asynchronous primary
			// answers commits, the synchronous one holds them.
			time.Sleep(time.Second)
			before := w.ackedIDs()
			if err := f.Kill(old); err != nil {
				t.Fatal(err)
			}
			_ = resume() // the senders are gone with their server
			p, err := f.WaitPrimary(ctx, old)
			if err != nil {
				t.Fatal(err)
			}
			lost, err := missing(ctx, p.NodeURL("paymesh"), before)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d commits acknowledged before the kill, %d of them lost", len(before), len(lost))
			switch {
			case async && len(lost) == 0:
				t.Fatalf("an asynchronous standby paused for 1 s lost nothing of %d acknowledged commits: the pause did not hold it back", len(before))
			case !async && len(lost) > 0:
				t.Fatalf("a synchronous standby lost %d acknowledged commits: %v", len(lost), lost)
			}
		})
	}
}

// TestSecureFormation runs a formation as a deployment would, with the
// deployed hba file (deploy/postgres/pg_hba.conf): clients reach the
// primary through the multi-host URL with verify-full and a scram-sha-256
// password, the standby streams over TLS as pgautofailover_replicator,
// no server has a rule that lets a network connection in without TLS and
// a password, and a connection without them is refused. It stays so
// through a failover and the rejoin of the killed node, wiped.
func TestSecureFormation(t *testing.T) {
	pghatest.Require(t)
	ctx := context.Background()
	dir := t.TempDir()
	srv := certs.Server{Name: "pg", Hosts: []string{"127.0.0.1"}}
	if _, err := certs.Make(certs.Options{Dir: dir}, []certs.Server{srv}); err != nil {
		t.Fatal(err)
	}
	f := pghatest.MustStart(t, pgha.Options{Secure: &pgha.Secure{
		CAFile: filepath.Join(dir, certs.CAFile), CertFile: filepath.Join(dir, srv.CertFile()), KeyFile: filepath.Join(dir, srv.KeyFile()),
		HBAFile: "../../../deploy/postgres/pg_hba.conf", Password: "pw with 'quotes' & spaces",
	}})
	check := func(when string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, f.URL("postgres"))
		if err != nil {
			t.Fatalf("%s: the multi-host URL: %v", when, err)
		}
		defer conn.Close(ctx)
		var ssl bool
		var repl []bool
		if err := conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
			t.Errorf("%s: the client's connection: TLS %v (%v)", when, ssl, err)
		}
		rows, err := conn.Query(ctx, `SELECT s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) WHERE r.usename = 'pgautofailover_replicator'`)
		if err == nil {
			repl, err = pgx.CollectRows(rows, pgx.RowTo[bool])
		}
		if err != nil || len(repl) != 1 || !repl[0] {
			t.Errorf("%s: the standby's stream: TLS %v (%v), want one over TLS", when, repl, err)
		}
		for _, n := range append([]*pgha.Node{f.Monitor}, f.Nodes...) {
			c, err := pgx.Connect(ctx, n.NodeURL("postgres"))
			if err != nil {
				t.Errorf("%s: %s: %v", when, n.Name, err)
				continue
			}
			var loose []string
			rows, err := c.Query(ctx, `SELECT type || ' ' || coalesce(auth_method, '') FROM pg_hba_file_rules
				WHERE type <> 'local' AND (type <> 'hostssl' OR auth_method <> 'scram-sha-256' OR error IS NOT NULL)`)
			if err == nil {
				loose, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			c.Close(ctx)
			if err != nil || len(loose) > 0 {
				t.Errorf("%s: %s lets in %v (%v)", when, n.Name, loose, err)
			}
			u, _ := url.Parse(n.NodeURL("postgres"))
			for what, mut := range map[string]func(*url.URL){
				"no password": func(u *url.URL) { u.User = url.User("postgres") },
				"no TLS": func(u *url.URL) {
					q := u.Query()
					q.Set("sslmode", "disable")
					u.RawQuery = q.Encode()
				},
			} {
				v := *u
				mut(&v)
				if c, err := pgx.Connect(ctx, v.String()); err == nil {
					c.Close(ctx)
					t.Errorf("%s: %s let a connection with %s in", when, n.Name, what)
				}
			}
		}
	}
	check("at the start")
	old, _ := f.Primary(ctx)
	if err := f.Kill(old); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WaitPrimary(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := f.Rejoin(ctx, old); err != nil {
		t.Fatal(err)
	}
	check("after a failover and the rejoin")
}
