package routerd_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/router/routerd"
)

func regions(t *testing.T) *idgen.Regions {
	t.Helper()
	ids, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestRouterForwards opens a region's ledger (it migrates the database and
// creates the ledger streams) and another region's router on the same
// server, submits a transfer through the router and waits until the
// ledger applied it: the forwarder moved it from the route stream to the
// ledger stream. Both publishes went
// through the WrapJetStream decorator, /metrics counts the forward, and
// after Close a second router opens on the same metrics address.
func TestRouterForwards(t *testing.T) {
	ns, _ := natsembed.MustStart(t)
	_, url := pgtest.MustDatabase(t)
	ids := regions(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	led, err := ledgerd.Open(ctx, ledgerd.Config{Region: "eu", Regions: ids, Node: 1, PostgresURL: url, NATSURL: ns.ClientURL(),
		Workers: 1, BatchSize: 16, AckWait: 5 * time.Second, MaxDeliver: 3, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	go led.Run(ctx) //nolint:errcheck // ends with ctx

	counted := &countingJetStream{}
	cfg := routerd.Config{Region: "us", Regions: ids, PostgresURL: url, NATSURL: ns.ClientURL(), Shards: 2, AckWait: 2 * time.Second,
		MetricsListen: "127.0.0.1:0", WrapJetStream: func(js jetstream.JetStream) jetstream.JetStream {
			counted.JetStream = js
			return counted
		}}
	srv, err := routerd.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()

	a, _, err := led.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := led.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	gen, _ := idgen.NewGenerator(ids, "eu", 9)
	tid := func() string { s, _ := gen.NextString(); return s }
	// Funded by the ledger itself: a fund is the operator's, which no
	// router forwards.
	if _, err := led.Store.Apply(ctx, []ledger.Command{{Type: ledger.TypeFund, TransferID: tid(), ClientID: "ops", IdempotencyKey: "f1",
		To: a.ID, Amount: 700, Currency: "EUR", CreatedAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Router().Submit(ctx, ledger.Command{Type: ledger.TypeTransfer, TransferID: tid(), ClientID: "c", IdempotencyKey: "t1",
		From: a.ID, To: b.ID, Amount: 300, Currency: "EUR", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	got, err := led.Store.Account(ctx, b.ID)
	for err == nil && got.Balance != 300 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		got, err = led.Store.Account(ctx, b.ID)
	}
	if err != nil || got.Balance != 300 {
		t.Fatalf("account after the forwarded transfer: got %d %v, want 300", got.Balance, err)
	}
	if s, a := counted.sync.Load(), counted.async.Load(); s != 1 || a < 1 {
		t.Fatalf("publishes through WrapJetStream: got %d sync and %d async, want 1 (the submit) and at least 1 (the forward)", s, a)
	}
	if body := scrape.Text(t, srv.MetricsURL()); !strings.Contains(body, "paymesh_router_forwarded_total") {
		t.Fatalf("metrics at %s: no paymesh_router_forwarded_total in\n%s", srv.MetricsURL(), body)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	cfg.MetricsListen = strings.TrimSuffix(strings.TrimPrefix(srv.MetricsURL(), "http://"), "/metrics")
	if err := srv.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	again, err := routerd.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("second open on %s after Close: %v", cfg.MetricsListen, err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRouterWaitsForDependencies opens a router while its Postgres is
// unreachable (a cut link) and its nats-server is not started yet: Open
// waits, logging, and succeeds once both are up. With a short
// ConnectTimeout it gives up and says what it waited for.
func TestRouterWaitsForDependencies(t *testing.T) {
	_, url := pgtest.MustDatabase(t)
	pgAddr := strings.TrimPrefix(strings.SplitN(strings.TrimPrefix(url, "postgres://"), "/", 2)[0], "postgres@")
	proxy, err := faultproxy.New(pgAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.Cut()
	viaProxy := strings.Replace(url, pgAddr, proxy.Addr(), 1)
	natsPort := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := routerd.Config{Region: "eu", Regions: regions(t), PostgresURL: viaProxy, NATSURL: "nats://" + net.JoinHostPort("127.0.0.1", itoa(natsPort)),
		Shards: 2, ConnectTimeout: 300 * time.Millisecond}

	if _, err := routerd.Open(ctx, cfg); err == nil || !strings.Contains(err.Error(), "not reachable within") {
		t.Fatalf("postgres down, short timeout: got %v, want not reachable within", err)
	}
	proxy.Heal()
	if _, err := routerd.Open(ctx, cfg); err == nil || !strings.Contains(err.Error(), "nats") {
		t.Fatalf("nats down, short timeout: got %v, want a nats error", err)
	}

	proxy.Cut()
	cfg.ConnectTimeout = 20 * time.Second
	var logged strings.Builder
	cfg.Log = newLog(&logged)
	type opened struct {
		srv *routerd.Server
		err error
	}
	res := make(chan opened, 1)
	go func() {
		s, err := routerd.Open(ctx, cfg)
		res <- opened{s, err}
	}()
	time.Sleep(700 * time.Millisecond)
	proxy.Heal()
	time.Sleep(700 * time.Millisecond)
	ns, err := natsembed.Start(natsembed.Options{Name: "late", Port: natsPort, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	r := <-res
	if r.err != nil {
		t.Fatalf("open with late dependencies: %v", r.err)
	}
	defer r.srv.Close()
	for _, want := range []string{"waiting for postgres at", "waiting for nats at " + cfg.NATSURL} {
		if n := strings.Count(logged.String(), want); n != 1 {
			t.Errorf("log: got %q %d times, want once; log:\n%s", want, n, logged.String())
		}
	}
}

// countingJetStream counts the publishes made through it.
type countingJetStream struct {
	jetstream.JetStream
	sync, async atomic.Int64
}

func (c *countingJetStream) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	c.sync.Add(1)
	return c.JetStream.PublishMsg(ctx, m, opts...)
}

func (c *countingJetStream) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	c.async.Add(1)
	return c.JetStream.PublishMsgAsync(m, opts...)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func itoa(n int) string { return strconv.Itoa(n) }

func newLog(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
