package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgha"
	"github.com/paymesh/paymesh/internal/testbed/pgserver"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// Workload shape.
const (
	clientID       = "chaos"
	accountsPer    = 6         // per region
	funding        = 1_000_000 // per account
	shards         = 4
	crossShare     = 0.4
	apiShare       = 0.3
	resubmitShare  = 0.10 // the same key and body again
	conflictShare  = 0.02 // the same key with another body
	burstShare     = 0.02 // several goroutines send one key at once
	burstSize      = 4
	maxRetries     = 4 // a client's retries of an unknown outcome
	defaultAckWait = 2 * time.Second
)

var dbSeq atomic.Int64

// env is one scenario run: the cluster, the history and the fault state.
type env struct {
	cfg  Config
	sc   *scenario
	seed uint64
	topo *natsembed.Topology
	dir  string
	pg   *pgserver.Throwaway // the scenario's own Postgres (scenario.ownPostgres), or nil
	ha   *pgha.Formation     // the scenario's own formation (scenario.ownHA), or nil
	// pgProxy relays every Postgres connection (scenario.pgProxy), or nil.
	pgProxy *faultproxy.Proxy
	c       *cluster.Cluster
	hist    *History
	names   []string
	accts   map[string][]string
	hot     []string
	gens    map[string]*idgen.Generator
	apiKey  string
	http    *http.Client

	// active is set while the workload runs: failpoints fire only then.
	active atomic.Bool
	fired  atomic.Int64
	sent   tally // requests sent, by purpose
	events tally // a scenario's own counters, by name
	// lastSlow is when scenario 3 last held a transaction (Unix ms).
	lastSlow atomic.Int64
	// holdsDue is the latest expiry of the run's holds (Unix ms).
	holdsDue atomic.Int64
	// later runs the flows' second halves (flows.go), so that a worker
	// goes on sending while a flow waits for its first request to apply.
	later sync.WaitGroup
	// cleanups stop what a scenario started of its own (a webhook
	// receiver), before the cluster stops.
	cleanups []func()

	rngMu sync.Mutex
	rng   *mrand.Rand
}

func (e *env) coin(p float64) bool {
	e.rngMu.Lock()
	defer e.rngMu.Unlock()
	return e.rng.Float64() < p
}

func (e *env) intn(n int) int {
	e.rngMu.Lock()
	defer e.rngMu.Unlock()
	return e.rng.IntN(n)
}

// tally counts events by name.
type tally struct{ m sync.Map } // name -> *atomic.Int64

func (t *tally) add(name string) {
	v, _ := t.m.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (t *tally) addN(name string, n int64) {
	v, _ := t.m.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Add(n)
}

func (t *tally) get(name string) int64 {
	if v, ok := t.m.Load(name); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// start runs a fresh three-region cluster for the scenario: one NATS
// server per region, three in the regions the scenario clusters.
func start(ctx context.Context, cfg Config, sc *scenario, seed uint64) (_ *env, err error) {
	table, err := regions.Default()
	if err != nil {
		return nil, err
	}
	e := &env{cfg: cfg, sc: sc, seed: seed, hist: &History{}, accts: map[string][]string{}, gens: map[string]*idgen.Generator{},
		http: &http.Client{Timeout: 10 * time.Second}, rng: mrand.New(mrand.NewPCG(seed, 0xc4a05))}
	for _, r := range table.Regions {
		e.names = append(e.names, r.Name)
	}
	defer func() {
		if err != nil {
			e.stop() // whatever was started
		}
	}()
	if e.dir, err = os.MkdirTemp("", "paymesh-chaos-nats-"); err != nil {
		return nil, err
	}
	nodes := map[string]int{}
	if !cfg.oneServer {
		for _, r := range sc.clustered {
			nodes[r] = 3
		}
	}
	if e.topo, err = natsembed.StartTopology(natsembed.TopologyOptions{Regions: e.names, Dir: e.dir, RegionNodes: nodes}); err != nil {
		return nil, err
	}
	ackWait := sc.ackWait
	if ackWait == 0 {
		ackWait = defaultAckWait
	}
	pgURL := cfg.PostgresURL
	if sc.ownPostgres {
		if e.pg, err = pgserver.StartThrowaway(ctx); err != nil {
			return nil, fmt.Errorf("scenario %s needs its own Postgres cluster: %w", sc.name, err)
		}
		pgURL = e.pg.URL
	}
	if sc.ownHA {
		if e.ha, err = pgha.Start(ctx, pgha.Options{}); err != nil {
			return nil, fmt.Errorf("scenario %s needs its own pg_auto_failover formation: %w", sc.name, err)
		}
		pgURL = e.ha.URL("postgres")
	}
	if sc.pgProxy {
		if e.pgProxy, pgURL, err = proxied(pgURL); err != nil {
			return nil, err
		}
	}
	ccfg := cluster.Config{
		Regions: table.Codes(), Topology: e.topo, PostgresURL: pgURL,
		DatabasePrefix: fmt.Sprintf("paymesh_chaos_%d_%d_", os.Getpid(), dbSeq.Add(1)),
		Shards:         shards, BatchSize: 64, AckWait: ackWait, DuplicateWindow: sc.dupWindow, APIWait: 3 * time.Second,
		KeyTTL: sc.keyTTL, Now: sc.now,
	}
	cfg.bugs.install(&ccfg)
	if sc.configure != nil {
		sc.configure(e, &ccfg)
	}
	if sc.beforeCommit != nil {
		ccfg.BeforeCommit = func(ctx context.Context) error {
			if !e.active.Load() {
				return nil
			}
			return sc.beforeCommit(ctx, e)
		}
	}
	if sc.dropAck != nil {
		ccfg.DropAck = func() bool { return e.active.Load() && sc.dropAck(e) }
	}
	if e.c, err = cluster.Start(ctx, ccfg); err != nil {
		return nil, err
	}
	if err := keepHistory(ctx, e.c); err != nil {
		return nil, err
	}
	for _, n := range e.names {
		if e.gens[n], err = idgen.NewGenerator(e.c.IDs(), n, 900); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// stop stops and removes what the env started; it skips what it never
// started.
func (e *env) stop() {
	for _, f := range slices.Backward(e.cleanups) {
		f()
	}
	if e.c != nil {
		e.c.Stop()
		if !e.cfg.Keep {
			_ = e.c.Drop(context.Background())
		}
	}
	if e.topo != nil {
		e.topo.Shutdown()
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
	if e.pg != nil { // the scenario's own cluster goes, whatever Keep says
		_ = e.pg.Stop()
	}
	if e.ha != nil {
		_ = e.ha.Stop()
	}
	if e.pgProxy != nil {
		_ = e.pgProxy.Close()
	}
}

// proxied starts a fault proxy in front of the server of pgURL and returns
// it with pgURL pointed at it.
func proxied(pgURL string) (*faultproxy.Proxy, string, error) {
	u, err := url.Parse(pgURL)
	if err != nil || u.Host == "" {
		return nil, "", fmt.Errorf("a Postgres URL with a host is needed to proxy it: %q", pgdb.Redact(pgURL))
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		return nil, "", err
	}
	u.Host = p.Addr()
	return p, u.String(), nil
}

// ledgerSum sums a ledger counter over the regions.
func (e *env) ledgerSum(counter func(*ledger.Stats) *atomic.Int64) int64 {
	var n int64
	for _, r := range e.names {
		n += counter(e.c.Region(r).Ledger.Stats).Load()
	}
	return n
}

func (e *env) id(region string) string {
	s, err := e.gens[region].NextString()
	if err != nil {
		panic(err) // this process's generator: it cannot run out for decades
	}
	return s
}

// open registers the API client, opens accountsPer accounts per region and
// funds each through its region's router, and waits until the cluster is
// quiet.
func (e *env) open(ctx context.Context) error {
	e.apiKey = newAPIKey("pm_chaos_")
	for _, n := range e.names {
		if err := e.c.Region(n).APIStore.PutClient(ctx, api.RegisteredClient{ID: clientID, Name: "chaos", RatePerSec: 1_000_000}, e.apiKey); err != nil {
			return err
		}
	}
	if e.sc.beforeAccounts != nil {
		if err := e.sc.beforeAccounts(ctx, e); err != nil {
			return err
		}
	}
	for _, n := range e.names {
		for range accountsPer {
			id, err := e.fundedAccount(ctx, n, clientID)
			if err != nil {
				return err
			}
			e.accts[n] = append(e.accts[n], id)
		}
	}
	e.hot = e.accts[e.names[0]][:4]
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return e.c.WaitQuiet(qctx)
}

// newAPIKey returns a random API key that starts with prefix.
func newAPIKey(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// fundedAccount opens an EUR account of client in region and funds it
// with funding through the region's router.
func (e *env) fundedAccount(ctx context.Context, region, client string) (string, error) {
	a, _, err := e.c.Region(region).Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: client, Currency: "EUR"})
	if err != nil {
		return "", err
	}
	cmd := ledger.Command{Type: ledger.TypeFund, TransferID: e.id(region), ClientID: "ops", IdempotencyKey: "fund-" + a.ID,
		To: a.ID, Amount: funding, Currency: "EUR", CreatedAt: time.Now()}
	if o := e.submitUntilKnown(ctx, PurposeFund, region, cmd); o != OK {
		return "", fmt.Errorf("funding %s: %s", a.ID, o)
	}
	return a.ID, nil
}

// run sends requests from workers goroutines until stop ends. A request
// still waiting a second later is abandoned: its pending sends end unknown
// and it is not retried.
func (e *env) run(ctx, stop context.Context, workers int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(stop, func() { time.AfterFunc(time.Second, cancel) })()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for stop.Err() == nil && ctx.Err() == nil {
				e.request(ctx, int(next.Add(1)-1))
			}
		})
	}
	wg.Wait()
	e.later.Wait() // the flows' second halves
}

// request sends the workload's i-th request, drawn from the seed and i
// alone, so a seed replays the same requests whatever the timing.
func (e *env) request(ctx context.Context, i int) {
	rng := mrand.New(mrand.NewPCG(e.seed, uint64(i)+1))
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	src := pick(e.names)
	dst := src
	if rng.Float64() < crossShare {
		for dst == src {
			dst = pick(e.names)
		}
	}
	from, to := pick(e.accts[src]), pick(e.accts[dst])
	if e.sc.hot {
		from, to = pick(e.hot), pick(e.hot)
	}
	for to == from {
		to = pick(e.accts[dst])
		if e.sc.hot {
			to = pick(e.hot)
		}
	}
	home, _ := e.c.IDs().HomeRegion(from)
	body := Body{Type: ledger.TypeTransfer, From: from, To: to, Amount: 1 + rng.Int64N(1000), Currency: "EUR"}
	key := fmt.Sprintf("s%d-%s-%d", e.seed, e.sc.name, i)
	viaAPI := rng.Float64() < apiShare
	via, other := pick(e.names), pick(e.names)
	extra := rng.Float64()
	conflicting := body
	conflicting.Amount++
	switch flow := rng.Float64(); {
	case flow < holdShare && !e.sc.hot:
		e.holdFlow(ctx, rng, key, home, via, viaAPI, body)
		return
	case flow < holdShare+refundShare && !e.sc.hot:
		e.refundFlow(ctx, rng, key, home, via, viaAPI, body)
		return
	case flow < holdShare+refundShare+accountShare && !e.sc.hot:
		e.accountFlow(ctx, rng, key, via, body)
		return
	}
	cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: e.id(home), ClientID: clientID, IdempotencyKey: key,
		From: body.From, To: body.To, Amount: body.Amount, Currency: body.Currency, CreatedAt: time.Now()}
	send := func(purpose, via string, b Body, c ledger.Command) {
		switch {
		case viaAPI:
			e.postUntilKnown(ctx, purpose, via, key, b)
		case purpose == PurposeConflict:
			e.submit(ctx, purpose, via, c) // once: see submit
		default:
			e.submitUntilKnown(ctx, purpose, via, c)
		}
	}
	if extra < burstShare { // concurrent sends of one key, in every region
		var wg sync.WaitGroup
		for n := range burstSize {
			wg.Go(func() { send(PurposeBurst, e.names[n%len(e.names)], body, cmd) })
		}
		wg.Wait()
		return
	}
	send(PurposeFirst, via, body, cmd)
	switch {
	case extra < burstShare+resubmitShare:
		again := cmd
		if rng.IntN(2) == 0 { // sent again as a new command: a new transfer ID, the same key and body
			again.TransferID = e.id(home)
		}
		send(PurposeResubmit, other, body, again)
	case extra < burstShare+resubmitShare+e.conflictShare():
		c := cmd
		c.TransferID, c.Amount = e.id(home), conflicting.Amount
		// Through the region of the first send: its route stream drops the
		// same Nats-Msg-Id, and the API compares the body with the key's.
		send(PurposeConflict, via, conflicting, c)
	}
}

// conflictShare is the share of transfers sent again with another body.
func (e *env) conflictShare() float64 {
	if e.cfg.conflictShare > 0 {
		return e.cfg.conflictShare
	}
	return conflictShare
}

func (e *env) body(cmd ledger.Command) Body {
	b := Body{Type: cmd.Type, From: cmd.From, To: cmd.To, Amount: cmd.Amount, Currency: cmd.Currency}
	if cmd.Hold {
		b.Type = typeHold
	}
	return b
}

// causes checks why the run's duplicates came: none of a cause unknown
// (every paymesh publisher says its attempt), and some of each cause the
// scenario's fault makes. It counts every layer's: the ledgers', the
// routers' and the APIs' replays (each a client's retry).
func (e *env) causes() Check {
	n := map[ledger.Cause]int64{}
	for _, r := range e.names {
		reg := e.c.Region(r)
		for c, v := range reg.Ledger.Stats.DuplicatesByCause() {
			n[c] += v
		}
		for k, v := range reg.Router.Stats().DuplicatesByCause() {
			n[k.Cause] += v
		}
		n[ledger.CauseClientRetry] += reg.API.Stats.Replays.Load()
	}
	chk := Check{Name: "causes", What: "every duplicate has a known cause, and the fault's causes show", OK: true}
	for _, v := range n {
		chk.Checked += v
	}
	if u := n[ledger.CauseUnknown]; u > 0 {
		chk.fail("%d duplicates of cause unknown: a publish that did not say its attempt (by cause: %v)", u, n)
	}
	for _, c := range e.sc.causes {
		if n[c] == 0 {
			chk.fail("no duplicate of cause %s, which the fault makes (by cause: %v)", c, n)
		}
	}
	return chk
}

// submitUntilKnown submits cmd through a router and, while the outcome is
// unknown, again (as a client would) up to maxRetries times, through any
// region.
func (e *env) submitUntilKnown(ctx context.Context, purpose, via string, cmd ledger.Command) Outcome {
	o := e.submit(ctx, purpose, via, cmd)
	for try := 1; o == Unknown && try <= maxRetries && ctx.Err() == nil; try++ {
		time.Sleep(time.Duration(try) * 250 * time.Millisecond)
		o = e.submit(ctx, PurposeRetry, e.names[e.intn(len(e.names))], cmd)
	}
	return o
}

// submit hands cmd to a region's router. Nil is ok; an error is unknown;
// a duplicate Nats-Msg-Id is a fail: the route stream stored nothing.
func (e *env) submit(ctx context.Context, purpose, via string, cmd ledger.Command) Outcome {
	e.sent.add(purpose)
	b := e.body(cmd)
	if cmd.Type == ledger.TypeFund {
		b.From = ""
	}
	i := e.hist.Invoke(Op{Client: cmd.ClientID, Key: cmd.IdempotencyKey, Body: b, Path: "router", Via: via, Purpose: purpose,
		Transfer: cmd.TransferID, cmd: cmd})
	sub, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	rt, err := e.c.SubmitterOf(sub, via, cmd)
	if err != nil {
		e.hist.Complete(i, Unknown, err.Error(), "")
		return Unknown
	}
	dup, err := rt.Submit(sub, cmd)
	switch {
	case err != nil:
		e.hist.Complete(i, Unknown, err.Error(), "")
		return Unknown
	case dup:
		e.hist.Complete(i, Fail, "duplicate Nats-Msg-Id: nothing stored", "")
		return Fail
	case purpose == PurposeConflict:
		// Stored: the window no longer knew the key's Msg-Id (scenario 4's
		// is short). The route stream's ack is then no answer to the
		// conflict; the ledger refuses it, so its outcome is unknown here.
		e.hist.Complete(i, Unknown, "stored past the Msg-Id window: the ledger decides", "")
		return Unknown
	}
	e.hist.Complete(i, OK, "", "")
	return OK
}

// postUntilKnown posts a transfer to a region's API and, while the outcome
// is unknown or the key is in flight (409), again up to maxRetries times,
// through any region.
func (e *env) postUntilKnown(ctx context.Context, purpose, via, key string, b Body) Outcome {
	o, status := e.post(ctx, purpose, via, key, b)
	for try := 1; (o == Unknown || status == http.StatusConflict) && try <= maxRetries && ctx.Err() == nil; try++ {
		time.Sleep(time.Duration(try) * 250 * time.Millisecond)
		o, status = e.post(ctx, PurposeRetry, e.names[e.intn(len(e.names))], key, b)
	}
	return o
}

// post sends one POST /v1/transfers: 200, 201 and 202 are ok; a 5xx or no
// answer is unknown; any other 4xx (a refusal, or 409: the key is in
// flight in another request) is a fail.
func (e *env) post(ctx context.Context, purpose, via, key string, b Body) (Outcome, int) {
	payload, _ := json.Marshal(api.TransferRequest{From: b.From, To: b.To, Amount: b.Amount, Currency: b.Currency})
	o, status, _ := e.postAt(ctx, purpose, via, key, b, "/v1/transfers", payload)
	return o, status
}
