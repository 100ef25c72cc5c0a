// Package demo runs paymesh's single-region demo: an embedded JetStream, a
// ledger on the local Postgres, funded accounts, and random transfers pushed
// through the stream with every kind of duplicate injected. It ends with the
// invariant report.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/natsembed"
	"github.com/paymesh/paymesh/internal/pgdb"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	ljs "github.com/paymesh/paymesh/services/ledger/jetstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/ledger/server"
)

// Config sets the demo's size and its duplicate injection rates (0..1).
type Config struct {
	PostgresURL   string // admin URL of the server to create the demo database on
	Database      string // demo database name (default paymesh_demo_<region>); dropped and recreated
	Region        string
	Accounts      int
	Transfers     int
	Seed          uint64
	ProducerRetry float64 // re-publish with the same Nats-Msg-Id (caught by JetStream)
	Redelivery    float64 // store an extra copy (as after the Msg-Id window): caught by the consume-log
	DropAck       float64 // batches whose acks are dropped after commit: redelivered by JetStream
	ClientRetry   float64 // a new transfer id with an old idempotency key: caught by the business key
	Poison        float64 // malformed commands: dead-lettered
	Keep          bool    // keep the demo database afterwards
	Live          bool    // redraw one status line (a terminal) instead of printing lines
}

// Report is what the demo prints at the end.
type Report struct {
	Commands                                      int64 // distinct commands sent
	Poison                                        int64 // malformed messages sent
	Applied, Rejected, DeadLettered, Redeliveries int64
	Injected                                      map[string]int64
	Caught                                        map[string]int64
	Elapsed                                       time.Duration
	Verify                                        postgres.Report
}

// OK reports whether every invariant passed, every distinct command was
// recorded once, every injected duplicate was caught and every poison
// message dead-lettered.
func (r Report) OK() bool {
	return r.Verify.OK() && r.Missed() == 0 && r.Applied+r.Rejected == r.Commands && r.DeadLettered == r.Poison
}

// Missed is injected duplicates minus the duplicates the layers reported:
// zero when each was caught exactly once.
func (r Report) Missed() int64 {
	var in, caught int64
	for _, n := range r.Injected {
		in += n
	}
	for _, n := range r.Caught {
		caught += n
	}
	return in - caught
}

// Run runs the demo, writing progress to out. It returns an error when the
// demo cannot start (no Postgres, no NATS) or is interrupted.
func Run(ctx context.Context, cfg Config, out io.Writer) (Report, error) {
	table, err := regions.Default()
	if err != nil {
		return Report{}, err
	}
	reg, ok := table.Get(cfg.Region)
	if !ok {
		return Report{}, fmt.Errorf("demo: region %q is not in deploy/regions/regions.yaml", cfg.Region)
	}
	ids, err := idgen.NewRegions(table.Codes())
	if err != nil {
		return Report{}, err
	}
	dbName := cfg.Database
	if dbName == "" {
		dbName = "paymesh_demo_" + reg.Name
	}
	url, err := pgdb.Create(ctx, cfg.PostgresURL, dbName, true)
	if err != nil {
		return Report{}, fmt.Errorf("%w\n\nThe demo needs PostgreSQL. Start the local server (pg_ctlcluster 15 main start) or set PAYMESH_POSTGRES_URL to a server where it may create databases", err)
	}
	if !cfg.Keep {
		defer pgdb.Drop(context.Background(), cfg.PostgresURL, dbName) //nolint:errcheck // best effort
	}
	dir, err := os.MkdirTemp("", "paymesh-demo-nats-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(dir)
	ns, err := natsembed.Start(natsembed.Options{Name: "demo-" + reg.Name, StoreDir: dir})
	if err != nil {
		return Report{}, err
	}
	defer ns.Shutdown()
	fmt.Fprintf(out, "paymesh demo: region %s (code %d), database %s, embedded JetStream at %s\n", reg.Name, reg.Code, dbName, ns.ClientURL())

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b9))
	var dropped atomic.Int64
	srv, err := server.Open(ctx, server.Config{
		Region: reg.Name, Regions: ids, Node: 1, PostgresURL: url, NATSURL: ns.ClientURL(), Workers: 2,
		BatchSize: 128, AckWait: 2 * time.Second, MaxDeliver: 10, CacheSize: 100_000,
		Log: slog.New(slog.DiscardHandler),
		AfterCommit: func(msgs []jetstream.Msg) error {
			// Forced redelivery: drop the acks of a committed batch, as a
			// worker that crashes between COMMIT and ack would.
			if rand.Float64() < cfg.DropAck {
				dropped.Add(int64(len(msgs)))
				return errors.New("demo: acks dropped")
			}
			return nil
		},
	})
	if err != nil {
		return Report{}, err
	}
	defer srv.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()

	start := time.Now()
	d := &driver{cfg: cfg, rng: rng, srv: srv, ids: ids, injected: map[string]int64{}, out: out}
	if d.gen, err = idgen.NewGenerator(ids, reg.Name, 2); err != nil {
		return Report{}, err
	}
	if err := d.run(ctx); err != nil {
		return Report{}, err
	}
	if err := d.waitDrained(ctx); err != nil {
		return Report{}, err
	}
	stop()
	if err := <-done; err != nil {
		return Report{}, err
	}
	// A dropped ack makes JetStream redeliver each message of the batch.
	d.injected["forced redelivery (acks dropped)"] = dropped.Load()
	rep := Report{
		Commands: d.commands, Poison: d.poison,
		Applied: srv.Stats.Applied.Load(), Rejected: srv.Stats.Rejected.Load(),
		DeadLettered: srv.Stats.DeadLettered.Load(), Redeliveries: srv.Stats.Redeliveries.Load(),
		Injected: d.injected, Caught: srv.Stats.Duplicates(), Elapsed: time.Since(start),
	}
	for k, v := range d.pubStats.Duplicates() {
		rep.Caught[k] += v
	}
	if rep.Verify, err = srv.Store.Verify(ctx); err != nil {
		return rep, err
	}
	return rep, nil
}

// driver creates the accounts and pushes the transfers.
type driver struct {
	cfg      Config
	rng      *rand.Rand
	srv      *server.Server
	ids      *idgen.Regions
	gen      *idgen.Generator
	pub      *ljs.Publisher
	pubStats ledger.Stats
	injected map[string]int64
	poison   int64
	commands int64
	out      io.Writer
	sent     []ledger.Command
	pending  []jetstream.PubAckFuture
	lastLine time.Time
}

func (d *driver) id() string {
	s, err := d.gen.NextString()
	if err != nil {
		panic(err) // the generator of this process: cannot run out for decades
	}
	return s
}

func (d *driver) run(ctx context.Context) error {
	js := d.srv.JetStream()
	d.pub = ljs.NewPublisher(js, d.srv.Topo, &d.pubStats)
	accounts := make([]string, d.cfg.Accounts)
	for i := range accounts {
		a, err := d.srv.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "demo", Currency: "EUR"})
		if err != nil {
			return err
		}
		accounts[i] = a.ID
		fund := ledger.Command{Type: ledger.TypeFund, TransferID: d.id(), ClientID: "demo", IdempotencyKey: "fund-" + a.ID,
			To: a.ID, Amount: 100_000, Currency: "EUR", CreatedAt: time.Now()}
		d.commands++
		if err := d.send(ctx, fund, d.pub.Msg(fund)); err != nil {
			return err
		}
	}
	fmt.Fprintf(d.out, "opened and funded %d accounts; sending %d transfers\n", len(accounts), d.cfg.Transfers)
	for i := range d.cfg.Transfers {
		from, to := accounts[d.rng.IntN(len(accounts))], accounts[d.rng.IntN(len(accounts))]
		for to == from {
			to = accounts[d.rng.IntN(len(accounts))]
		}
		cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: d.id(), ClientID: "demo", IdempotencyKey: fmt.Sprintf("t-%d-%d", d.cfg.Seed, i),
			From: from, To: to, Amount: 1 + d.rng.Int64N(5_000), Currency: "EUR", CreatedAt: time.Now()}
		d.commands++
		if err := d.send(ctx, cmd, d.pub.Msg(cmd)); err != nil {
			return err
		}
		if err := d.inject(ctx, cmd); err != nil {
			return err
		}
		if i%500 == 499 {
			if err := d.flush(ctx); err != nil {
				return err
			}
			d.progress(i+1, false)
		}
	}
	return d.flush(ctx)
}

// inject adds duplicates of cmd at the configured rates.
func (d *driver) inject(ctx context.Context, cmd ledger.Command) error {
	if d.rng.Float64() < d.cfg.ProducerRetry {
		d.injected["producer retry (same Msg-Id)"]++
		if err := d.send(ctx, cmd, d.pub.Msg(cmd)); err != nil {
			return err
		}
	}
	if d.rng.Float64() < d.cfg.Redelivery {
		d.injected["late copy (past the Msg-Id window)"]++
		m := d.pub.Msg(cmd)
		m.Header.Del(jetstream.MsgIDHeader)
		if err := d.send(ctx, cmd, m); err != nil {
			return err
		}
	}
	if d.rng.Float64() < d.cfg.ClientRetry && len(d.sent) > 0 {
		// A client retries an earlier request with its key but a new
		// transfer id, long after the consume-log forgot it. Here the
		// consume-log still knows the key, so it, not the business key,
		// catches most of these.
		old := d.sent[d.rng.IntN(len(d.sent))]
		if old.Type == ledger.TypeTransfer {
			d.injected["client retry (same key, new transfer id)"]++
			old.TransferID = d.id()
			m := d.pub.Msg(old)
			m.Header.Del(jetstream.MsgIDHeader)
			if err := d.send(ctx, old, m); err != nil {
				return err
			}
		}
	}
	if d.rng.Float64() < d.cfg.Poison {
		d.poison++
		m := nats.NewMsg(d.srv.Topo.Subject(cmd.From))
		m.Data = []byte(strings.Replace(string(cmd.Encode()), `"amount":`, `"amount":0.5,"x":`, 1))
		if err := d.publish(m); err != nil {
			return err
		}
	}
	return nil
}

func (d *driver) send(_ context.Context, cmd ledger.Command, m *nats.Msg) error {
	d.sent = append(d.sent, cmd)
	return d.publish(m)
}

func (d *driver) publish(m *nats.Msg) error {
	f, err := d.pub.PublishAsync(m)
	if err != nil {
		return err
	}
	d.pending = append(d.pending, f)
	return nil
}

// flush waits for every outstanding publish ack, counting the duplicates
// JetStream caught, and re-publishes (same Msg-Id) what was not acked.
func (d *driver) flush(ctx context.Context) error {
	for len(d.pending) > 0 {
		pending := d.pending
		d.pending = nil
		for _, f := range pending {
			select {
			case ack := <-f.Ok():
				d.pub.Observe(ack)
			case <-f.Err():
				if err := d.publish(f.Msg()); err != nil {
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// waitDrained waits until the ledger consumer has acked everything, printing
// progress.
func (d *driver) waitDrained(ctx context.Context) error {
	js := d.srv.JetStream()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if n, err := ljs.Backlog(ctx, js, d.srv.Topo); err == nil && n == 0 {
			d.progress(d.cfg.Transfers, true)
			return nil
		}
		d.progress(d.cfg.Transfers, false)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (d *driver) progress(sent int, final bool) {
	st := d.srv.Stats
	var dups int64
	for _, n := range st.Duplicates() {
		dups += n
	}
	end := "\r"
	if final || !d.cfg.Live {
		end = "\n"
	}
	if !d.cfg.Live && !final {
		if time.Since(d.lastLine) < 2*time.Second {
			return
		}
		d.lastLine = time.Now()
	}
	fmt.Fprintf(d.out, "sent %6d/%d  applied %6d  rejected %5d  duplicates caught %5d  redeliveries %5d  dead-lettered %4d%s",
		sent, d.cfg.Transfers, st.Applied.Load(), st.Rejected.Load(), dups, st.Redeliveries.Load(), st.DeadLettered.Load(), end)
}

// Print writes the final report.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\n== paymesh demo report (%s) ==\n", r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "commands %d: applied %d, rejected %d (insufficient funds); poison %d, dead-lettered %d; redeliveries %d\n",
		r.Commands, r.Applied, r.Rejected, r.Poison, r.DeadLettered, r.Redeliveries)
	fmt.Fprintln(w, "duplicates injected:")
	for _, k := range sortedKeys(r.Injected) {
		fmt.Fprintf(w, "  %-45s %6d\n", k, r.Injected[k])
	}
	fmt.Fprintln(w, "duplicates caught, by layer:")
	for _, k := range sortedKeys(r.Caught) {
		fmt.Fprintf(w, "  %-45s %6d\n", k, r.Caught[k])
	}
	line := func(ok bool, format string, args ...any) {
		verdict := "PASS"
		if !ok {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "%s  "+format+"\n", append([]any{verdict}, args...)...)
	}
	line(r.Missed() == 0, "every injected duplicate was caught exactly once (injected minus caught: %d)", r.Missed())
	line(r.Applied+r.Rejected == r.Commands, "every command recorded exactly once (%d sent, %d recorded)", r.Commands, r.Applied+r.Rejected)
	line(r.DeadLettered == r.Poison, "every poison message dead-lettered (%d sent, %d dead-lettered)", r.Poison, r.DeadLettered)
	fmt.Fprint(w, r.Verify.String())
}

func sortedKeys(m map[string]int64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
