package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/lab/hookaudit"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/receiver"
	"github.com/paymesh/paymesh/services/webhooks"
)

// Scenarios 18 to 21 send the workload client's events by webhook to the
// reference receiver (services/receiver), in-process, on a database of its
// own, and attack it: a crash after its COMMIT and before its 2xx, answers
// slower than the delivery timeout, its shop's database failing for a
// while, a region's delivery worker killed mid-batch. The checks
// (checkHooks): every event's effect happened at the receiver exactly
// once, and none was lost (each applied, or its delivery failed with its
// attempts recorded).

// hookFault is which of the four faults a run injects.
type hookFault int

const (
	hookCrash hookFault = iota
	hookSlow
	hookErrors
	hookKill
)

// hookTimeout is the delivery timeout of these scenarios: short, so that a
// slow receiver passes it and a killed worker's lease runs out soon.
const hookTimeout = 300 * time.Millisecond

// hookKillSlow is how long the receiver takes per COMMIT in scenario 21:
// below the timeout, longer than a region takes to stop.
const hookKillSlow = 60 * time.Millisecond

// hookShare is the share of deliveries the crash and slow faults hit.
const hookShare = 0.3

// hookRun is one webhook scenario's receiver and its state.
type hookRun struct {
	fault    hookFault
	e        *env
	pool     *pgxpool.Pool
	recv     atomic.Pointer[receiver.Receiver]
	srv      *httptest.Server
	endpoint string
	fired    atomic.Int64
	down     atomic.Bool // the shop's database is failing (hookErrors)
	// killing holds the receiver's COMMITs while a region is being killed
	// (hookKill), so that its worker dies with its posts unanswered.
	killing atomic.Bool
}

var errShopDown = errors.New("chaos: the shop's database is not answering")

// start makes the receiver's database and server, creates the workload
// client's endpoint for every event type, starts the receiver with its
// secret, and waits until every region holds the endpoint.
func (h *hookRun) start(ctx context.Context, e *env) error {
	h.e = e
	name := fmt.Sprintf("paymesh_chaos_hooks_%d_%d", os.Getpid(), dbSeq.Add(1))
	url, err := pgdb.Create(ctx, e.cfg.PostgresURL, name, true)
	if err != nil {
		return err
	}
	e.cleanups = append(e.cleanups, func() {
		if !e.cfg.Keep {
			_ = pgdb.Drop(context.Background(), e.cfg.PostgresURL, name)
		}
	})
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pc.MaxConns = 48 // every region's lane at once, and the deliberate bug's second transaction each
	if h.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	e.cleanups = append(e.cleanups, h.pool.Close)
	if err := pgdb.Migrate(ctx, h.pool, receiver.Migrations()); err != nil {
		return err
	}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rc := h.recv.Load(); rc != nil {
			rc.ServeHTTP(w, r)
			return
		}
		http.Error(w, "not started", http.StatusServiceUnavailable)
	}))
	e.cleanups = append(e.cleanups, h.srv.Close)
	if e.cfg.bugs.HookEndlessLease {
		if err := endlessLeases(ctx, e); err != nil {
			return err
		}
	}
	cl := &api.Client{BaseURL: e.c.Region(e.names[0]).APIURL, APIKey: e.apiKey}
	ep, err := hookaudit.CreateEndpoint(ctx, cl, h.srv.URL+"/webhooks", "chaos-hook")
	if err != nil {
		return err
	}
	h.endpoint = ep.ID
	rc, err := receiver.New(receiver.Config{DB: h.db(), Secrets: []string{ep.Secret}, Effects: h.effects()})
	if err != nil {
		return err
	}
	h.recv.Store(rc)
	return h.target().WaitCopies(ctx, time.Minute)
}

// db is the receiver's database with the run's fault, and its bug.
func (h *hookRun) db() receiver.DB {
	var db receiver.DB = faultyDB{Pool: h.pool, h: h}
	if h.e.cfg.bugs.HookCommitLater {
		db = commitLater{db}
	}
	return db
}

// effects is the toy shop, with the run's fault and its bugs.
func (h *hookRun) effects() receiver.Effects {
	var fx receiver.Effects = receiver.Orders{}
	if h.fault == hookErrors {
		fx = failingShop{fx, h}
	}
	if h.e.cfg.bugs.HookSwallowErrors {
		fx = swallowed{fx}
	}
	if h.e.cfg.bugs.HookEffectOutsideTx {
		fx = outsideTx{inner: fx, db: h.db()}
	}
	return fx
}

// faultyDB is the receiver's database with the crash, slow and kill
// faults in each transaction's COMMIT.
type faultyDB struct {
	*pgxpool.Pool
	h *hookRun
}

func (d faultyDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return faultyTx{Tx: tx, h: d.h}, nil
}

type faultyTx struct {
	pgx.Tx
	h *hookRun
}

func (t faultyTx) Commit(ctx context.Context) error {
	h := t.h
	switch h.fault {
	case hookCrash:
		// The process dies after its COMMIT and before its 2xx: the
		// connection closes with no answer.
		err := t.Tx.Commit(ctx)
		if err == nil && h.e.coin(hookShare) {
			h.fired.Add(1)
			panic(http.ErrAbortHandler)
		}
		return err
	case hookSlow:
		if h.e.coin(hookShare) {
			h.fired.Add(1)
			time.Sleep(2 * hookTimeout) // the sender gave up meanwhile
			if h.e.coin(0.5) {
				// Committed after the sender left: its retry is a duplicate.
				return t.Tx.Commit(context.WithoutCancel(ctx))
			}
			// The sender's leaving cancelled the request: rolled back, the
			// retry applies it.
		}
	case hookKill:
		// A slow receiver keeps the worker's batches in flight, so that the
		// kill finds posts unanswered.
		time.Sleep(hookKillSlow)
		for h.killing.Load() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return t.Tx.Commit(ctx)
}

// failingShop is the shop's database failing while the errors fault is
// on: every effect fails, and the receiver answers 503.
type failingShop struct {
	inner receiver.Effects
	h     *hookRun
}

func (f failingShop) Apply(ctx context.Context, tx pgx.Tx, e receiver.Event) error {
	if f.h.down.Load() {
		f.h.fired.Add(1)
		return errShopDown
	}
	return f.inner.Apply(ctx, tx, e)
}

// The deliberate bugs.

// outsideTx applies the effect in a transaction of its own, committed
// before the event's ID is recorded (scenario 18's bug: deduplicating
// after the effect, outside its transaction).
type outsideTx struct {
	inner receiver.Effects
	db    receiver.DB
}

func (o outsideTx) Apply(ctx context.Context, _ pgx.Tx, e receiver.Event) error {
	tx, err := o.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := o.inner.Apply(ctx, tx, e); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// commitLater answers before the COMMIT: the commit runs after the
// handler has answered 2xx, with the request's context (scenario 19's bug:
// a receiver that answers first to stay within the sender's timeout).
type commitLater struct{ receiver.DB }

func (c commitLater) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := c.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &laterTx{Tx: tx}, nil
}

type laterTx struct {
	pgx.Tx
	handed atomic.Bool
}

func (t *laterTx) Commit(ctx context.Context) error {
	t.handed.Store(true)
	go func() {
		if err := t.Tx.Commit(ctx); err != nil {
			_ = t.Tx.Rollback(context.Background())
		}
	}()
	return nil
}

func (t *laterTx) Rollback(ctx context.Context) error {
	if t.handed.Load() {
		return nil // the commit goroutine owns the transaction
	}
	return t.Tx.Rollback(ctx)
}

// swallowed answers 2xx though the effect failed: the event's ID is
// recorded without its effect (scenario 20's bug).
type swallowed struct{ inner receiver.Effects }

func (s swallowed) Apply(ctx context.Context, tx pgx.Tx, e receiver.Event) error {
	_ = s.inner.Apply(ctx, tx, e)
	return nil
}

// endlessLeases makes every claim's lease last forever in each region
// (scenario 21's bug): a worker killed mid-batch leaves its deliveries
// leased, never claimed again.
func endlessLeases(ctx context.Context, e *env) error {
	for _, n := range e.names {
		_, err := e.c.Region(n).Ledger.Store.Pool().Exec(ctx, `
			CREATE FUNCTION chaos_endless_lease() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.leased_until IS NOT NULL THEN NEW.leased_until := 'infinity'; END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER chaos_endless_lease BEFORE UPDATE ON webhook_deliveries
			FOR EACH ROW EXECUTE FUNCTION chaos_endless_lease();`)
		if err != nil {
			return fmt.Errorf("endless leases in %s: %w", n, err)
		}
	}
	return nil
}

// hookConfig gives every region's API these scenarios' delivery settings:
// loopback allowed, a short timeout, retries from 100 ms up to 1 s.
func hookConfig(_ *env, c *cluster.Config) {
	onAPI(c, func(ac *apid.Config) {
		ac.WebhookAllowHosts = []string{"127.0.0.1"}
		ac.WebhookTimeout = hookTimeout
		ac.WebhookSchedule = webhooks.Schedule{First: 100 * time.Millisecond, Longest: time.Second, MaxAge: time.Hour}
	})
}

// hookScenario builds scenario 18, 19, 20 or 21.
func hookScenario(f hookFault) func() *scenario {
	return func() *scenario {
		h := &hookRun{fault: f}
		s := &scenario{configure: hookConfig, beforeAccounts: h.start, extra: h.checkHooks,
			fired: func(*env) int64 { return h.fired.Load() }}
		retried := func(*env) bool {
			return h.fired.Load() > 0 && h.recv.Load().Stats().Duplicates(receiver.CauseRetry) > 0
		}
		const every = "the workload client's events go by webhook to the reference receiver (services/receiver) on its own database; "
		switch f {
		case hookCrash:
			s.name, s.counts = "18-hook-crash", "receiver crashes after COMMIT, before the 2xx"
			s.what = every + fmt.Sprintf("%.0f %% of the receiver's COMMITs are followed by its crash before it answers (the connection "+
				"closes with no answer), so paymesh sends the event again", 100*hookShare)
			s.effect = retried
		case hookSlow:
			s.name, s.counts = "19-hook-slow", "deliveries answered slower than the delivery timeout"
			s.what = every + fmt.Sprintf("%.0f %% of the receiver's transactions wait %v before COMMIT, past the delivery timeout (%v): "+
				"half then commit (the retry is a duplicate), half are rolled back as the sender left", 100*hookShare, 2*hookTimeout, hookTimeout)
			s.effect = func(*env) bool { return h.fired.Load() > 0 }
		case hookErrors:
			s.name, s.counts = "20-hook-errors", "deliveries refused 503 while the shop's database failed"
			s.what = every + "from 20 % to 60 % of the run the shop's database fails every effect, and the receiver answers 503"
			s.effect = func(*env) bool { return h.fired.Load() > 0 }
			s.fault = h.errorWindow
		case hookKill:
			s.name, s.counts = "21-hook-worker-kill", "deliveries in flight when their region's delivery worker was killed"
			s.what = every + "from 30 % of the run, a region with deliveries in flight is restarted as a crash would (its delivery " +
				"worker killed mid-batch), again every 30 % of the run; the receiver takes 20 ms per COMMIT, so batches are in flight"
			s.effect = func(*env) bool { return h.fired.Load() > 0 }
			s.fault = h.killWorkers
		}
		return s
	}
}

func init() {
	for _, f := range []hookFault{hookCrash, hookSlow, hookErrors, hookKill} {
		registry = append(registry, hookScenario(f))
	}
}

// errorWindow fails the shop's database from 20 % to 60 % of the run.
func (h *hookRun) errorWindow(ctx context.Context, _ *env, d time.Duration) error {
	start := time.Now()
	defer h.down.Store(false)
	if !at(ctx, start, d, 0.2) {
		return nil
	}
	h.down.Store(true)
	at(ctx, start, d, 0.6)
	return nil
}

// killWorkers kills, from 30 % of the run and every 30 % after, the
// delivery worker of the region with the most deliveries in flight
// (leased), as soon as one has some (killRegion). The fault's count is
// the claims the kills left unrecorded.
func (h *hookRun) killWorkers(ctx context.Context, e *env, d time.Duration) error {
	for next := time.Now().Add(d * 3 / 10); ctx.Err() == nil; {
		if !at(ctx, next, 0, 0) {
			return nil
		}
		region, leased := "", 0
		for _, n := range e.names {
			var k int
			err := e.c.Region(n).Ledger.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
				WHERE endpoint_id = $1 AND status = 'pending' AND leased_until > now()`, h.endpoint).Scan(&k)
			if err == nil && k > leased {
				region, leased = n, k
			}
		}
		if leased == 0 {
			next = time.Now().Add(20 * time.Millisecond)
			continue
		}
		cut, err := h.killRegion(context.WithoutCancel(ctx), e, region)
		if err != nil {
			return err
		}
		h.fired.Add(cut)
		next = time.Now().Add(d * 3 / 10)
	}
	return nil
}

// killRegion restarts a region as a crash would, with its delivery
// worker dying mid-batch: its posts are held unanswered at the receiver,
// and the record of its batch (Finish) never commits. An in-process stop
// would record what it sent; a killed process records nothing, so the
// record is blocked by a lock on webhook_attempts and its backend
// terminated, until the region is up again. It returns the claims left
// unrecorded.
func (h *hookRun) killRegion(ctx context.Context, e *env, region string) (int64, error) {
	// A connection of its own: the region's pools close with it.
	conn, err := pgx.Connect(ctx, e.c.Region(region).URL)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	lock, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE webhook_attempts IN SHARE MODE`); err != nil {
		return 0, err
	}
	h.killing.Store(true)
	defer h.killing.Store(false)
	restarted := make(chan error, 1)
	go func() { restarted <- e.c.RestartRegion(ctx, region) }()
	for {
		select {
		case err := <-restarted:
			if err != nil {
				return 0, err
			}
			var cut int64
			err = lock.QueryRow(ctx, `SELECT coalesce(sum(d.attempts - coalesce(a.n, 0)), 0) FROM webhook_deliveries d
				LEFT JOIN (SELECT account_id, sequence, count(*) AS n FROM webhook_attempts WHERE endpoint_id = $1 GROUP BY 1, 2) a
				USING (account_id, sequence) WHERE d.endpoint_id = $1`, h.endpoint).Scan(&cut)
			return cut, err
		case <-time.After(5 * time.Millisecond):
		}
		// The batch records waiting for the lock die with their worker.
		if _, err := lock.Exec(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
			JOIN pg_class c ON c.oid = l.relation AND c.relname = 'webhook_attempts' WHERE NOT l.granted`); err != nil {
			return 0, err
		}
	}
}
