package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/services/ledger/ledgertest"
)

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
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &verifyCmd{regionDB: regionDB{Region: "eu", PostgresURL: f.URL, Database: strings.TrimPrefix(u.Path, "/")}, WindowDays: 7}
	if err := cmd.Run(context.Background(), tab); err != nil {
		t.Fatalf("clean ledger: %v", err)
	}
	if _, err := f.Pool.Exec(context.Background(), `UPDATE accounts SET balance = balance + 5 WHERE id = $1`, b); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Run(context.Background(), tab); !errors.Is(err, errFailed) {
		t.Fatalf("tampered ledger: got %v, want the failing exit", err)
	}
	if err := (&verifyCmd{regionDB: regionDB{Region: "mars"}}).Run(context.Background(), tab); err == nil || !strings.Contains(err.Error(), "mars") {
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

func TestDemoFlagsRejected(t *testing.T) {
	for name, c := range map[string]demoCmd{
		"RateAboveOne":  {Accounts: 10, DropAck: 1.5},
		"NegativeRate":  {Accounts: 10, Poison: -0.1},
		"OneAccount":    {Accounts: 1},
		"NegativeCount": {Accounts: 10, Transfers: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if err := c.Run(context.Background()); err == nil {
				t.Fatal("want an error")
			}
		})
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
