package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// defaultRegions returns the built-in region table and its ID regions.
func defaultRegions(t *testing.T) (regions.Table, *idgen.Regions) {
	t.Helper()
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	ids, err := idgen.NewRegions(tab.Codes())
	if err != nil {
		t.Fatal(err)
	}
	return tab, ids
}

// TestVerifyCommand: `paymesh verify` passes a clean ledger and fails (exit
// 1) on one whose balance was tampered with.
func TestVerifyCommand(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	f.MustApply(t, f.Transfer(t, a, b, 5))
	u, err := url.Parse(f.URL)
	if err != nil {
		t.Fatal(err)
	}
	tab, ids := defaultRegions(t)
	cmd := &verifyCmd{regionDB: regionDB{Region: "eu", PostgresURL: f.URL, Database: strings.TrimPrefix(u.Path, "/")}, WindowDays: 7}
	if err := cmd.Run(context.Background(), tab, ids); err != nil {
		t.Fatalf("clean ledger: %v", err)
	}
	if _, err := f.Pool.Exec(context.Background(), `UPDATE accounts SET balance = balance + 5 WHERE id = $1`, b); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Run(context.Background(), tab, ids); !errors.Is(err, errFailed) {
		t.Fatalf("tampered ledger: got %v, want the failing exit", err)
	}
	if err := (&verifyCmd{regionDB: regionDB{Region: "mars"}}).Run(context.Background(), tab, ids); err == nil || !strings.Contains(err.Error(), "mars") {
		t.Fatalf("unknown region: got %v", err)
	}
}

func TestShardSet(t *testing.T) {
	for in, want := range map[string]string{"0/1": "[0 1 2 3 4 5]", "1/2": "[1 3 5]", "2/3": "[2 5]"} {
		got, err := (&ledgerCmd{Shards: 6, ShardSet: in}).ownShards()
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("%s: got %v %v, want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "1", "2/2", "-1/2", "a/b", "0/0", "0/7", "1/2x"} {
		if _, err := (&ledgerCmd{Shards: 6, ShardSet: bad}).ownShards(); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestMigrateCommand(t *testing.T) {
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	f := ledgertest.New(t)
	u, _ := url.Parse(f.URL)
	cmd := &migrateCmd{regionDB: regionDB{Region: "us", PostgresURL: f.URL, Database: strings.TrimPrefix(u.Path, "/")}, WindowDays: 7}
	if err := cmd.Run(context.Background(), tab); err != nil {
		t.Fatalf("migrate an up-to-date database: %v", err)
	}
	bad := &migrateCmd{regionDB: regionDB{Region: "eu", PostgresURL: "mysql://nope"}}
	if err := bad.Run(context.Background(), tab); err == nil || !strings.Contains(err.Error(), "postgres://") {
		t.Fatalf("bad URL: got %v, want an error naming the expected scheme", err)
	}
}

// TestVerifyAll: `paymesh verify --all` checks every region and the
// invariants across them, and fails when transit money has no transfer.
func TestVerifyAll(t *testing.T) {
	ctx := context.Background()
	tab, ids := defaultRegions(t)
	prefix := fmt.Sprintf("pmtest_all_%d_", os.Getpid())
	var eu *postgres.Store
	for _, r := range tab.Regions {
		url, err := pgdb.Create(ctx, pgtest.AdminURL(), prefix+r.Name, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pgdb.Drop(context.Background(), pgtest.AdminURL(), prefix+r.Name) })
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		gen, _ := idgen.NewGenerator(ids, r.Name, 5)
		s := postgres.New(pool, postgres.Config{Region: r.Name, Regions: ids, IDs: gen, Dedup: postgres.NewConsumeLog(dedup.New(dedup.Config{}))})
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"}); err != nil {
			t.Fatal(err)
		}
		if r.Name == "eu" {
			eu = s
		}
	}
	cmd := &verifyCmd{regionDB: regionDB{PostgresURL: pgtest.AdminURL()}, All: true, Quiescent: true, DBPrefix: prefix, WindowDays: 7}
	if err := cmd.Run(ctx, tab, ids); err != nil {
		t.Fatalf("empty regions: %v", err)
	}
	// Money parked in eu's transit account with no transfer in flight.
	if _, err := eu.Pool().Exec(ctx, `UPDATE accounts SET balance = balance + 5 WHERE kind = 'transit'`); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Run(ctx, tab, ids); !errors.Is(err, errFailed) {
		t.Fatalf("transit money without a transfer: got %v, want the failing exit", err)
	}
}

// TestTraceRatioFlag: --trace-ratio defaults to telemetry.DefaultTraceRatio,
// is read from PAYMESH_TRACE_RATIO, and a value that is not a share from 0
// to 1 fails the parse with an error naming the flag.
func TestTraceRatioFlag(t *testing.T) {
	if c := parse(t, "verify"); c.TraceRatio != telemetry.DefaultTraceRatio {
		t.Errorf("default: %v, want %v", c.TraceRatio, telemetry.DefaultTraceRatio)
	}
	t.Setenv("PAYMESH_TRACE_RATIO", "0.25")
	if c := parse(t, "verify"); c.TraceRatio != 0.25 {
		t.Errorf("from PAYMESH_TRACE_RATIO: %v, want 0.25", c.TraceRatio)
	}
	for _, v := range []string{"2", "-0.5", "NaN", "lots"} {
		var c cli
		k, err := kong.New(&c, kong.Name("paymesh"), cliVars)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Parse([]string{"--trace-ratio", v, "verify"}); err == nil || !strings.Contains(err.Error(), "--trace-ratio") {
			t.Errorf("--trace-ratio %s: got %v, want an error naming the flag", v, err)
		}
	}
}
