package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/router"
)

// scenario is one fault and how to inject it.
type scenario struct {
	name string
	// what the scenario does, and what its fault counter counts.
	what, counts string
	ackWait      time.Duration
	workers      int
	hot          bool // the workload moves money among four accounts only
	// dupWindow is the route and ledger streams' Nats-Msg-Id window (zero:
	// the default).
	dupWindow time.Duration
	// minRun is the shortest workload the scenario runs, whatever
	// Config.Duration says.
	minRun time.Duration
	// ownPostgres puts the regions' databases on a throwaway cluster the
	// run starts (pgserver.StartThrowaway) and stops, instead of
	// Config.PostgresURL, so the fault may restart it (e.pg).
	ownPostgres bool
	// ownHA puts them on a pg_auto_failover formation the run starts
	// (pgha.Start: a primary and a synchronous standby) and stops, reached
	// through its multi-host URL, so the fault may kill its primary (e.ha).
	ownHA bool
	// pgProxy runs every Postgres connection through a fault proxy
	// (e.pgProxy).
	pgProxy bool
	// keyTTL and now are the APIs' idempotency-key TTL and clock (see
	// cluster.Config; zero: the defaults).
	keyTTL time.Duration
	now    func() time.Time
	// clustered names the regions that run a JetStream cluster of three
	// servers, their streams kept on all three (R3); the others run one
	// server. Config.oneServer runs them on one server too.
	clustered []string
	// configure changes the cluster's configuration before it starts: the
	// scenario installs its own hooks through the services' seams.
	configure func(e *env, c *cluster.Config)
	// beforeAccounts runs once the cluster is up and the API client
	// registered, before the workload's accounts are opened.
	beforeAccounts func(ctx context.Context, e *env) error
	// beforeCommit and dropAck are the ledger's faults (see
	// cluster.Config), consulted only while the workload runs.
	beforeCommit func(ctx context.Context, e *env) error
	dropAck      func(e *env) bool
	// causes are the causes the scenario's duplicates must show (its
	// fault's); the causes check also fails on any duplicate whose cause
	// is unknown.
	causes []ledger.Cause
	// fault runs alongside the workload, for d; it must leave the cluster
	// whole (healed, restarted) when it returns.
	fault func(ctx context.Context, e *env, d time.Duration) error
	// fired returns the fault counter (default e.fired).
	fired func(e *env) int64
	// effect, if set, reports whether the fault has had the effect the
	// scenario's checks look for. The workload and the fault go on past
	// their duration until it has, for at most effectWait: a loaded machine
	// does in 1.5 s less than the checks need. (Not a default for every
	// scenario: with some deliberate bugs a fault counter rightly stays at
	// zero, as scenario 12's refusals when the forgeries are allowed.)
	effect func(e *env) bool
	// extra returns the scenario's own checks.
	extra func(ctx context.Context, e *env) ([]Check, error)
}

var errKilled = errors.New("chaos: worker killed before COMMIT")

// Scenario 4's shortened duplicate window, and how long after its
// acknowledgement a command is retried: past the window, and past the
// stream's purge of expired Msg-Ids (at most one more window).
const (
	lateWindow = 300 * time.Millisecond
	lateAge    = 3 * lateWindow
)

// effectWait bounds how long a run goes on past its duration for its
// fault to have its effect (scenario.effect).
const effectWait = 2 * time.Minute

// untilEffect returns the context of the workload and the fault: it ends
// once d has passed and the fault has had its effect (scenario.effect), or
// effectWait after that without it (the scenario's checks then say what
// it missed).
func (e *env) untilEffect(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if e.sc.effect == nil {
		return context.WithTimeout(ctx, d)
	}
	wctx, cancel := context.WithTimeout(ctx, d+effectWait)
	go func() {
		if !at(wctx, time.Now(), d, 1) {
			return
		}
		for !e.sc.effect(e) {
			select {
			case <-wctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		cancel()
	}()
	return wctx, cancel
}

// relaysTried counts the saga steps into region written since since that
// the other regions have tried to send (their ledgers after the COMMIT, or
// their relays): sent, or failed at least once.
func (e *env) relaysTried(ctx context.Context, region string, since time.Time) int {
	total := 0
	for _, n := range e.names {
		if n == region || e.c.Region(n) == nil {
			continue
		}
		var c int
		err := e.c.Region(n).Ledger.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox
			WHERE region = $1 AND created_at >= $2 AND (sent_at IS NOT NULL OR attempts > 0)`, region, since).Scan(&c)
		if err == nil {
			total += c
		}
	}
	return total
}

// at sleeps until fraction f of d has passed since start, or ctx ends.
func at(ctx context.Context, start time.Time, d time.Duration, f float64) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(start.Add(time.Duration(f * float64(d))))):
		return true
	}
}

// every runs fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			fn()
		}
	}
}

// registry builds each scenario afresh, so that every run (scenario and
// seed) starts with clean fault state. The scenarios without state of
// their own are copies of builtin; the others register their constructors
// from their files' init.
var registry []func() *scenario

func init() {
	for _, s := range builtin {
		registry = append(registry, func() *scenario { c := *s; return &c })
	}
}

// Scenarios lists the built scenarios in the order they run.
func Scenarios() []string {
	var out []string
	for _, build := range registry {
		out = append(out, build().name)
	}
	// Scenarios in files of their own register from init, in file order:
	// list them all by their number.
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(number(a), number(b)) })
	return out
}

// number is a scenario's number, the part of its name before the dash.
func number(name string) int {
	n, _ := strconv.Atoi(strings.SplitN(name, "-", 2)[0])
	return n
}

var builtin = []*scenario{
	{
		name: "1-duplicates",
		what: "no faults: 10% of requests sent again with the same key and body (half of the router ones as a new command, " +
			"with a new transfer ID), 2% again with the same key and another body, 2% as bursts of 4 concurrent sends of one key",
		counts: "resubmits, conflicting bodies and burst sends made",
		causes: []ledger.Cause{ledger.CauseClientRetry},
		fired: func(e *env) int64 {
			return e.sent.get(PurposeResubmit) + e.sent.get(PurposeConflict) + e.sent.get(PurposeBurst)
		},
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			chk := Check{Name: "conflicts", What: "every conflicting body through the API was refused", OK: true}
			for _, op := range e.hist.Ops() {
				// postUntilKnown retries until an answer comes, so an unknown
				// conflict is one the run's end cut off: it has no verdict.
				if op.Purpose == PurposeConflict && op.Path == "api" && op.Outcome != Unknown {
					chk.Checked++
					if op.Outcome != Fail {
						chk.fail("key %s: a conflicting body was answered %s (%s)", op.Key, op.Outcome, op.Detail)
					}
				}
			}
			return []Check{chk}, nil
		},
	},
	{
		name:   "2-kill",
		causes: []ledger.Cause{ledger.CauseRedelivery},
		what: "ledger workers killed: 5% of the acks of committed messages are lost (a crash after COMMIT, before the " +
			"ack: a decorator of the ledger's JetStream handle), 3% of apply transactions fail just before COMMIT (a crash " +
			"mid-transaction: a decorator of the consume-log), and two " +
			"regions' ledger, router and API are restarted at random times",
		counts: "acks lost after COMMIT + transactions killed before COMMIT + region restarts",
		beforeCommit: func(_ context.Context, e *env) error {
			share := 0.03
			if e.cfg.killShare > 0 {
				share = e.cfg.killShare
			}
			if e.coin(share) {
				e.fired.Add(1)
				return errKilled
			}
			return nil
		},
		dropAck: func(e *env) bool {
			if e.coin(0.05) {
				e.fired.Add(1)
				return true
			}
			return false
		},
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			start := time.Now()
			for _, f := range []float64{0.2 + 0.2*float64(e.intn(100))/100, 0.6 + 0.2*float64(e.intn(100))/100} {
				if !at(ctx, start, d, f) {
					return nil
				}
				if err := e.c.RestartRegion(context.WithoutCancel(ctx), e.names[e.intn(len(e.names))]); err != nil {
					return err
				}
				e.fired.Add(1)
			}
			return nil
		},
	},
	{
		name:   "3-slow-ack",
		causes: []ledger.Cause{ledger.CauseRedelivery},
		what: "AckWait of 1 s while some transactions take 1.5 s (a delay before COMMIT, at most one every 400 ms in the " +
			"cluster), and the first, fourth, ... of those then fail (a slow worker that dies): JetStream redelivers their " +
			"messages while the first attempt still runs, and a redelivery must wait for that attempt's outcome, not take " +
			"it for done",
		counts:  "transactions held past AckWait (and the redeliveries must be > 0)",
		ackWait: time.Second,
		beforeCommit: func(ctx context.Context, e *env) error {
			now := time.Now().UnixMilli()
			last := e.lastSlow.Load()
			if now-last < 400 || !e.lastSlow.CompareAndSwap(last, now) {
				return nil
			}
			n := e.fired.Add(1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(1500 * time.Millisecond):
			}
			if n%3 == 1 { // the first, fourth, ... held transaction
				e.events.add(slowFailed)
				return errKilled
			}
			return nil
		},
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			chk := Check{Name: "redelivered", OK: true}
			chk.Checked = e.ledgerSum(func(s *ledger.Stats) *atomic.Int64 { return &s.Redeliveries })
			chk.What = fmt.Sprintf("messages were redelivered (%d; %d held transactions failed)", chk.Checked, e.events.get(slowFailed))
			if chk.Checked == 0 {
				chk.fail("no ledger redelivery: AckWait never expired during a transaction")
			}
			return []Check{chk}, nil
		},
	},
	{
		name: "4-late-retry",
		what: fmt.Sprintf("producer retries after the Nats-Msg-Id duplicate window expired: the route and ledger streams keep "+
			"a %v window, and commands a router acknowledged at least %v earlier are submitted again through a router with "+
			"the same Msg-Id (half of them as a new command, with a new transfer ID); the consume-log must catch them",
			lateWindow, lateAge),
		counts:    "retries the route stream stored again (its window had expired)",
		dupWindow: lateWindow,
		minRun:    3 * time.Second, // retries begin lateAge into the run
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			return every(ctx, 50*time.Millisecond, func() {
				var cands []Op
				for _, op := range e.hist.Ops() {
					if op.Path == "router" && op.Outcome == OK && op.Purpose != PurposeFund && time.Since(op.Complete) >= lateAge {
						cands = append(cands, op)
					}
				}
				if len(cands) == 0 {
					return
				}
				op := cands[e.intn(len(cands))]
				cmd := op.cmd
				if e.coin(0.5) { // sent again as a new command: a new transfer ID, the same key and body
					home, _ := e.c.IDs().HomeRegion(cmd.From)
					cmd.TransferID = e.id(home)
				}
				if e.submit(ctx, PurposeLate, op.Via, cmd) == OK {
					e.fired.Add(1) // stored: the window no longer knew the Msg-Id
				}
			})
		},
	},
	{
		name: "5-pg-reset",
		what: "Postgres connections reset: every 150 ms one backend of a region's database, busy or idle in a " +
			"transaction, is terminated (pg_terminate_backend), and every connection runs through a loopback proxy that " +
			"cuts the next COMMIT it carries, in turn before the server gets it and right after (the server commits, the " +
			"answer is lost)",
		counts:  "backends terminated + COMMITs cut (each kind must fire, and the ledger must see unanswered COMMITs)",
		pgProxy: true,
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			// One trap at a time: armed, and armed again with the other
			// mode once it fired (a one-shot trap fires at most once).
			modes := []faultproxy.Mode{faultproxy.DropBefore, faultproxy.DropAfter}
			armed, seen := 0, e.pgProxy.Fired()
			e.pgProxy.Trap(commitMessage, modes[armed])
			defer e.pgProxy.Trap(nil, 0) // disarmed: the checks commit through the proxy too
			return every(ctx, 150*time.Millisecond, func() {
				if f := e.pgProxy.Fired(); f > seen {
					seen = f
					e.fired.Add(1)
					e.events.add(cutName[modes[armed]])
					armed = (armed + 1) % len(modes)
					e.pgProxy.Trap(commitMessage, modes[armed])
				}
				n := e.names[e.intn(len(e.names))]
				pool := e.c.Region(n).Ledger.Store.Pool()
				var killed int64
				_ = pool.QueryRow(ctx, `
					SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
					    SELECT pid FROM pg_stat_activity
					    WHERE datname = current_database() AND pid <> pg_backend_pid()
					      AND state IN ('active', 'idle in transaction')
					    ORDER BY random() LIMIT 1) x`).Scan(&killed)
				e.fired.Add(killed)
			})
		},
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			unanswered := e.ledgerSum(func(s *ledger.Stats) *atomic.Int64 { return &s.CommitsUnanswered })
			before, after := e.events.get(cutName[faultproxy.DropBefore]), e.events.get(cutName[faultproxy.DropAfter])
			chk := Check{Name: "mid-commit", OK: true, Checked: before + after,
				What: fmt.Sprintf("COMMITs were cut before the server got them (%d) and after it committed (%d); the "+
					"stores read the outcome back after %d unanswered COMMITs", before, after, unanswered)}
			if before == 0 || after == 0 {
				chk.fail("a kind of COMMIT cut never fired: %d before, %d after", before, after)
			}
			if unanswered == 0 {
				chk.fail("no ledger COMMIT went unanswered")
			}
			return []Check{chk}, nil
		},
	},
	{
		name: "7-nats-restart",
		what: "a region's NATS server (JetStream, file storage) shut down, left down for 500 ms and until the other regions' " +
			"ledgers or relays have tried 2 saga steps into it (5 s at most), and started again, twice, in random regions",
		counts: "NATS server restarts",
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			start := time.Now()
			for _, f := range []float64{0.3, 0.65} {
				if !at(ctx, start, d, f) {
					return nil
				}
				r, down := e.names[e.intn(len(e.names))], time.Now()
				// Down until the outage has met steps sent, whatever the
				// machine's load: a step relayed into it must wait for it.
				tried := func() bool {
					return time.Since(down) >= 500*time.Millisecond && e.relaysTried(ctx, r, down) >= 2
				}
				if err := e.topo.RestartRegionWhen(r, tried, 5*time.Second); err != nil {
					return err
				}
				e.fired.Add(1)
			}
			return nil
		},
	},
	{
		name:   "8-partition",
		what:   "a random region's leafnode link cut (a partition) for 40% of the run, then healed",
		counts: "partitions",
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			start := time.Now()
			if !at(ctx, start, d, 0.2) {
				return nil
			}
			r := e.names[e.intn(len(e.names))]
			e.topo.Cut(r)
			e.fired.Add(1)
			// Cut for 40 % of the run, and on until the cut is in the way
			// of acknowledged commands, whatever the machine's load: six
			// that routers stored after the cut began and whose way home
			// crosses it, and every command waiting to cross tried at least
			// once. (A loaded machine can time most submits out, and a
			// command whose client retried through another region is no
			// command the cut holds.) At most effectWait more.
			cut := time.Now()
			retried := e.forwardRetries()
			at(ctx, start, d, 0.6)
			for end := time.Now().Add(effectWait); ctx.Err() == nil && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if e.crossingAcked(r, cut) >= 6 && e.crossingTried(ctx, r, retried) {
					break
				}
			}
			e.topo.Heal(r)
			e.events.add("healed")
			return nil
		},
		// The workload goes on until the cut is healed: on a loaded
		// machine the run's planned window can pass before three forwards
		// have met the cut.
		effect: func(e *env) bool { return e.events.get("healed") > 0 },
	},
	{
		name: "9-contention",
		what: "heavy contention: every transfer moves money among the same four accounts of one region, from 8 " +
			"workers, while a contender transaction locks two of them in the reverse order every 250 ms, so the " +
			"ledger's transactions meet deadlocks (40P01, detected after 100 ms) and retry",
		counts:  "ledger transactions that met 40001/40P01/55P03/23505 (retried or, with no budget left, given up)",
		hot:     true,
		workers: 8,
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			hot := slices.Sorted(slices.Values(e.hot))
			pool := e.c.Region(e.names[0]).Ledger.Store.Pool()
			// The ledger's sessions look for deadlocks after 100 ms instead
			// of the server's 1 s, so a short run meets many: set on the
			// hot region's database, and taken up by the new connections
			// once Reset has closed the pool's.
			if _, err := pool.Exec(ctx, deadlockTimeoutSQL); err != nil {
				return err
			}
			pool.Reset()
			// Every 250 ms: a cycle (20 ms, plus 100 ms when it deadlocks)
			// ends well before the next, so a ledger transaction meets a
			// deadlock now and then, never on every retry.
			return every(ctx, 250*time.Millisecond, func() {
				// The ledger locks in ID order; this locks the highest first,
				// and lets the ledger's session detect the deadlock.
				_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '10s'`); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, hot[len(hot)-1]); err != nil {
						return err
					}
					time.Sleep(20 * time.Millisecond)
					_, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, hot[0])
					return err
				})
			})
		},
		fired: contended,
		// A loaded machine's short run may meet no deadlock: it goes on
		// until one is met.
		effect: func(e *env) bool { return contended(e) > 0 },
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			chk := Check{Name: "budget", What: "the retry budget was never exhausted: no transaction or apply gave up", OK: true, Checked: 1}
			if n := e.ledgerSum(func(s *ledger.Stats) *atomic.Int64 { return &s.GaveUp }); n > 0 {
				chk.fail("%d transactions gave up on a deadlock, serialization failure or lock timeout", n)
			}
			if n := e.ledgerSum(func(s *ledger.Stats) *atomic.Int64 { return &s.ApplyFailed }); n > 0 {
				chk.fail("%d applies gave up (Stats.ApplyFailed)", n)
			}
			return []Check{chk}, nil
		},
	},
}

// contended counts scenario 9's fault: the ledger transactions that met
// a deadlock, serialization failure or lock timeout (retried or given up).
func contended(e *env) int64 {
	return e.ledgerSum(func(s *ledger.Stats) *atomic.Int64 { return &s.Retries }) +
		e.ledgerSum(func(s *ledger.Stats) *atomic.Int64 { return &s.GaveUp })
}

// deadlockTimeoutSQL shortens deadlock_timeout for the sessions of
// scenario 9's database.
const deadlockTimeoutSQL = `DO $$ BEGIN
	EXECUTE format('ALTER DATABASE %I SET deadlock_timeout = %L', current_database(), '100ms');
END $$`

// commitMessage is COMMIT as pgx sends it: a simple-protocol query
// message ('Q', its length, the text).
var commitMessage = []byte("Q\x00\x00\x00\x0bcommit\x00")

var cutName = map[faultproxy.Mode]string{faultproxy.DropBefore: "commit-cut-before", faultproxy.DropAfter: "commit-cut-after"}

// slowFailed counts scenario 3's held transactions that then failed (an
// env event).
const slowFailed = "slow-failed"

// builderByName returns the constructor of a scenario named by name or
// number.
func builderByName(name string) (func() *scenario, error) {
	for _, build := range registry {
		if s := build(); s.name == name || strings.SplitN(s.name, "-", 2)[0] == name {
			return build, nil
		}
	}
	return nil, fmt.Errorf("unknown scenario %q (built: %s)", name, strings.Join(Scenarios(), ", "))
}

// scenarioByName returns a fresh scenario named by name or number.
func scenarioByName(name string) (*scenario, error) {
	build, err := builderByName(name)
	if err != nil {
		return nil, err
	}
	return build(), nil
}

// crossingAcked counts the client commands sent to a router after since,
// and acknowledged, whose way to their home region crosses region cut's link: the
// router that stored them, or their home, is cut's.
func (e *env) crossingAcked(cut string, since time.Time) int {
	n := 0
	for _, op := range e.hist.Ops() {
		if op.Path != "router" || op.Outcome != OK || op.Invoke.Before(since) || op.Body.From == "" {
			continue
		}
		home, err := e.c.IDs().HomeRegion(op.Body.From)
		if err == nil && home != op.Via && (home == cut || op.Via == cut) {
			n++
		}
	}
	return n
}

// crossingTried reports whether the routers have tried every command
// waiting to cross region cut's link at least once: none of the forward
// consumers across it has one undelivered, and the routers' failed
// forwards since they counted retried cover those not acked (a forward
// acked, or taken as acked, is gone from the work-queue route stream).
func (e *env) crossingTried(ctx context.Context, cut string, retried int64) bool {
	var pending, held int64
	for _, x := range e.names {
		js := e.c.Region(x).RouterJetStream()
		for _, home := range e.names {
			if home == x || (home != cut && x != cut) {
				continue
			}
			cons, err := js.Consumer(ctx, router.Stream(x), router.ForwardDurable(home))
			if err != nil {
				return false
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return false
			}
			pending += int64(info.NumPending)
			held += int64(info.NumAckPending)
		}
	}
	return pending == 0 && e.forwardRetries()-retried >= held
}

// forwardRetries sums the routers' failed forwards.
func (e *env) forwardRetries() int64 {
	var n int64
	for _, x := range e.names {
		n += e.c.Region(x).Router.Stats().ForwardRetries.Load()
	}
	return n
}
