package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/syncbuf"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
)

// TestClientOneRegion: with only eu's database, `paymesh client acme`
// registers nowhere and names us's missing database and the command that
// creates it; with --region eu it registers in eu.
func TestClientOneRegion(t *testing.T) {
	ctx := context.Background()
	tab, ids := defaultRegions(t)
	prefix := fmt.Sprintf("pmtest_client_%d_", os.Getpid())
	eu := migratedEU(t, tab, prefix)
	registered := func() bool {
		_, ok, err := eu.ClientByID(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	all := &clientCmd{regionStores: regionStores{PostgresURL: pgtest.AdminURL(), DBPrefix: prefix}, ID: "acme", Rate: 100}
	err := all.Run(ctx, tab, ids, discard)
	for _, want := range []string{"region us: database " + prefix + "us does not exist", "paymesh migrate --region us --database " + prefix + "us --create",
		"region ap: database " + prefix + "ap does not exist", "--region eu"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("every region, only eu's database: got %v, want an error with %q", err, want)
		}
	}
	if registered() {
		t.Fatal("a failed registration left the client in eu")
	}
	one := &clientCmd{regionStores: regionStores{PostgresURL: pgtest.AdminURL(), DBPrefix: prefix, Regions: []string{"eu"}}, ID: "acme", Rate: 100}
	if err := one.Run(ctx, tab, ids, discard); err != nil {
		t.Fatalf("--region eu: %v", err)
	}
	if !registered() {
		t.Fatal("--region eu: the client is not in eu")
	}
	if err := (&clientCmd{regionStores: regionStores{PostgresURL: pgtest.AdminURL(), Regions: []string{"mars"}}, ID: "acme"}).Run(ctx, tab, ids, discard); err == nil || !strings.Contains(err.Error(), "mars") {
		t.Fatalf("--region mars: got %v, want an error naming it", err)
	}
}

var discard = slog.New(slog.DiscardHandler)

// TestClientOperator: `paymesh client alice --operator` registers an
// operator (its key authenticates in that role); an operator with an
// overdraft is refused before anything is written, and so is an id of
// the other role.
func TestClientOperator(t *testing.T) {
	ctx := context.Background()
	tab, ids := defaultRegions(t)
	prefix := fmt.Sprintf("pmtest_clientop_%d_", os.Getpid())
	eu := migratedEU(t, tab, prefix)
	cmd := func(id string, operator bool, overdraft int64) *clientCmd {
		return &clientCmd{regionStores: regionStores{PostgresURL: pgtest.AdminURL(), DBPrefix: prefix, Regions: []string{"eu"}}, ID: id, Rate: 100, Operator: operator, Overdraft: overdraft, Key: id + "-key-0123456789", security: security{InsecureDev: true}}
	}
	if err := cmd("alice", true, 0).Run(ctx, tab, ids, discard); err != nil {
		t.Fatalf("--operator: %v", err)
	}
	if c, ok, err := eu.ClientByKey(ctx, api.HashKey("alice-key-0123456789")); err != nil || !ok || c.Role != api.RoleOperator {
		t.Fatalf("alice: got %+v %v %v, want an operator", c, ok, err)
	}
	if err := cmd("bob", true, 5).Run(ctx, tab, ids, discard); err == nil || !strings.Contains(err.Error(), "an operator moves no money") {
		t.Fatalf("--operator --max-overdraft 5: got %v, want it refused", err)
	}
	if _, ok, _ := eu.ClientByID(ctx, "bob"); ok {
		t.Fatal("the refused operator bob is registered")
	}
	if err := cmd("acme", false, 0).Run(ctx, tab, ids, discard); err != nil {
		t.Fatal(err)
	}
	if err := cmd("acme", true, 0).Run(ctx, tab, ids, discard); !errors.Is(err, apidb.ErrRoleTaken) {
		t.Fatalf("client acme registered again with --operator: got %v, want ErrRoleTaken", err)
	}
}

// TestClientWaitsForMigrations: `paymesh client` started on a database its
// API has not migrated yet (docker-compose starts them together) waits
// for the tables, logging once, and registers the client; with nobody to
// migrate it gives up after --connect-timeout and says what to run.
func TestClientWaitsForMigrations(t *testing.T) {
	ctx := context.Background()
	tab, ids := defaultRegions(t)
	prefix := fmt.Sprintf("pmtest_clientwait_%d_", os.Getpid())
	db := prefix + "eu"
	if _, err := pgdb.Create(ctx, pgtest.AdminURL(), db, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pgdb.Drop(context.Background(), pgtest.AdminURL(), db) })

	early := &clientCmd{regionStores: regionStores{PostgresURL: pgtest.AdminURL(), DBPrefix: prefix, Regions: []string{"eu"}, Wait: 300 * time.Millisecond}, ID: "acme", Rate: 100}
	err := early.Run(ctx, tab, ids, discard)
	if err == nil || !strings.Contains(err.Error(), "not migrated after 300ms") || !strings.Contains(err.Error(), "paymesh migrate --region eu") {
		t.Fatalf("no API to migrate: got %v, want an error saying what to run", err)
	}

	var logs syncbuf.Buffer
	migrated := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		migrated <- (&migrateCmd{regionDB: regionDB{Region: "eu", PostgresURL: pgtest.AdminURL(), Database: db}, WindowDays: 7}).Run(ctx, tab)
	}()
	c := &clientCmd{regionStores: regionStores{PostgresURL: pgtest.AdminURL(), DBPrefix: prefix, Regions: []string{"eu"}, Wait: time.Minute}, ID: "acme", Rate: 100}
	if err := c.Run(ctx, tab, ids, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatalf("migrated while waiting: %v", err)
	}
	if err := <-migrated; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "waiting for the region's API to migrate its tables"); n != 1 {
		t.Errorf("logged the wait %d times, want once:\n%s", n, logs.String())
	}
}

// TestLedgerWaitsForNATS: `paymesh ledger` started before its nats-server
// logs that it waits, then runs (serves /metrics) once the server is up,
// instead of exiting.
func TestLedgerWaitsForNATS(t *testing.T) {
	_, pgURL := pgtest.MustDatabase(t)
	u, _ := url.Parse(pgURL)
	db := regionDB{Region: "eu", PostgresURL: pgURL, Database: strings.TrimPrefix(u.Path, "/")}
	tab, ids := defaultRegions(t)
	natsAddr, metricsAddr := freeAddr(t), freeAddr(t)
	var logged syncbuf.Buffer
	c := &ledgerCmd{regionDB: db, regionNATS: regionNATS{NATSURL: "nats://" + natsAddr, StreamReplicas: 1}, Workers: 1, BatchSize: 16, AckWait: 5 * time.Second, MaxDeliver: 3,
		Lease: 30 * time.Second, WindowDays: 2, Shards: 2, ShardSet: "0/1", Metrics: metricsAddr, dependencyWait: dependencyWait{ConnectTimeout: 20 * time.Second},
		security: security{InsecureDev: true}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, tab, ids, slog.New(slog.NewTextHandler(&logged, nil))) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logged.String(), "waiting for nats at nats://"+natsAddr) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("ledger exited while NATS was down: %v", err)
	default:
	}
	_, port, _ := net.SplitHostPort(natsAddr)
	p, _ := strconv.Atoi(port)
	ns, err := natsembed.Start(natsembed.Options{Name: "late", Port: p, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	var body string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && !strings.Contains(body, "paymesh_deliveries_total"); time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			body = string(b)
		}
	}
	if !strings.Contains(body, "paymesh_deliveries_total") {
		t.Fatalf("the ledger does not serve /metrics after NATS came up; log:\n%s", logged.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ledger: %v", err)
	}
	if n := strings.Count(logged.String(), "waiting for nats"); n != 1 {
		t.Errorf("got %d waiting lines, want 1; log:\n%s", n, logged.String())
	}
}
