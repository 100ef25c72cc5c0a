package ledgerd_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/nodelease"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// TestServerRuns opens a region ledger on an empty database (it migrates it
// and creates its streams), runs it, and applies a funded transfer sent
// through JetStream. Its /metrics counts it. Its maintenance prunes an
// outbox row sent longer ago than the retention.
func TestServerRuns(t *testing.T) {
	ns, _ := natsembed.MustStart(t)
	pool, url := pgtest.MustDatabase(t) // empty: the server migrates it
	ids, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2, "ap": 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := ledgerd.Open(ctx, ledgerd.Config{Region: "eu", Regions: ids, Node: 3, PostgresURL: url, NATSURL: ns.ClientURL(),
		Workers: 2, BatchSize: 16, AckWait: 5 * time.Second, MaxDeliver: 3, WindowDays: 2, CacheSize: 100, Shards: 4,
		MetricsListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (msg_id, region, account, payload, sent_at)
		VALUES ('old', 'us', 'x', '', now() - interval '25 hours'), ('recent', 'us', 'x', '', now())`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	a, _, err := srv.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := srv.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	gen, _ := idgen.NewGenerator(ids, "eu", 4)
	tid := func() string { s, _ := gen.NextString(); return s }
	pub := ledgerstream.NewPublisher(srv.JetStream(), srv.Topo, ids, nil)
	for _, c := range []ledger.Command{
		{Type: ledger.TypeFund, TransferID: tid(), ClientID: "c", IdempotencyKey: "f1", To: a.ID, Amount: 500, Currency: "EUR", CreatedAt: time.Now()},
		{Type: ledger.TypeTransfer, TransferID: tid(), ClientID: "c", IdempotencyKey: "t1", From: a.ID, To: b.ID, Amount: 200, Currency: "EUR", CreatedAt: time.Now()},
	} {
		if _, err := pub.Publish(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for (srv.Stats.Applied.Load() < 2 || srv.Stats.OutboxPruned.Load() < 1) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	got, err := srv.Store.Account(ctx, b.ID)
	if err != nil || got.Balance != 200 {
		t.Fatalf("destination: got %d %v, want 200", got.Balance, err)
	}
	rep, err := srv.Store.Verify(ctx)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v\n%s", err, rep)
	}
	var left []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(msg_id) FROM outbox`).Scan(&left); err != nil || len(left) != 1 || left[0] != "recent" {
		t.Errorf("outbox after the maintenance: got %v %v, want [recent]", left, err)
	}
	resp, err := http.Get(srv.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`paymesh_transfers_applied_total{consumer="ledger",region="eu",stream="LEDGER_EU"} 2`,
		`paymesh_outbox_pruned_total{consumer="ledger",region="eu",stream="LEDGER_EU"} 1`, "paymesh_apply_batch_size_bucket"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics at %s: no %s in\n%s", srv.MetricsURL(), want, body)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestServerOpenErrors(t *testing.T) {
	ids, _ := idgen.NewRegions(map[string]uint8{"eu": 1})
	ctx := context.Background()
	if _, err := ledgerd.Open(ctx, ledgerd.Config{Region: "eu", Regions: ids, PostgresURL: "postgres://postgres@127.0.0.1:1/x?connect_timeout=2"}); err == nil {
		t.Fatal("unreachable Postgres: want an error")
	}
	if _, err := ledgerd.Open(ctx, ledgerd.Config{Region: "mars", Regions: ids}); err == nil {
		t.Fatal("unknown region: want an error")
	}
	_, url := pgtest.MustDatabase(t)
	if _, err := ledgerd.Open(ctx, ledgerd.Config{Region: "eu", Regions: ids, PostgresURL: url, NATSURL: "nats://127.0.0.1:1"}); err == nil {
		t.Fatal("unreachable NATS: want an error")
	}
}

// TestLedgerNodeLeased: a second ledger on the node id a live ledger holds
// is refused with an error naming the holder.
func TestLedgerNodeLeased(t *testing.T) {
	ns, _ := natsembed.MustStart(t)
	_, url := pgtest.MustDatabase(t)
	ids, _ := idgen.NewRegions(map[string]uint8{"eu": 1})
	ctx := context.Background()
	// A short lease: the second ledger waits two of them for the first to end.
	cfg := ledgerd.Config{Region: "eu", Regions: ids, Node: 1, PostgresURL: url, NATSURL: ns.ClientURL(), Shards: 2, NodeTTL: time.Second}
	first, err := ledgerd.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := ledgerd.Open(ctx, cfg)
	if err == nil {
		second.Close()
		t.Fatal("second ledger on node 1 opened; want it refused while the first holds the node")
	}
	if !errors.Is(err, nodelease.ErrHeld) || !strings.Contains(err.Error(), "held by \"ledger ") {
		t.Fatalf("second ledger on node 1: got %v, want ErrHeld naming the first ledger", err)
	}
}
