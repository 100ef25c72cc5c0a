package demo_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/internal/demo"
	"github.com/paymesh/paymesh/internal/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
)

func TestDemoPasses(t *testing.T) {
	var out strings.Builder
	rep, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: pgtest.AdminURL(), Database: fmt.Sprintf("pmtest_demo_%d", os.Getpid()), Region: "eu",
		Accounts: 20, Transfers: 1500, Seed: 7,
		ProducerRetry: 0.05, Redelivery: 0.05, DropAck: 0.3, ClientRetry: 0.05, Poison: 0.01,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	rep.Print(&out)
	if !rep.OK() {
		t.Fatalf("demo failed:\n%s", out.String())
	}
	for _, l := range []dedup.Layer{dedup.LayerMsgID, dedup.LayerTable} {
		if rep.Caught[string(l)] == 0 && !(l == dedup.LayerTable && rep.Caught[string(dedup.LayerCache)] > 0) {
			t.Errorf("no duplicates caught by %s: %v", l, rep.Caught)
		}
	}
	if rep.Poison == 0 || rep.Redeliveries == 0 {
		t.Errorf("injection did not happen: poison %d, redeliveries %d", rep.Poison, rep.Redeliveries)
	}
	if !strings.Contains(out.String(), "PASS  [eu] balance equals the sum of its change-log") {
		t.Errorf("report lacks the invariant lines:\n%s", out.String())
	}
}

func TestDemoWithoutPostgres(t *testing.T) {
	_, err := demo.Run(context.Background(), demo.Config{
		PostgresURL: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2", Region: "eu", Accounts: 2,
	}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "PAYMESH_POSTGRES_URL") {
		t.Fatalf("got %v, want an error that says to set PAYMESH_POSTGRES_URL", err)
	}
}

func TestDemoUnknownRegion(t *testing.T) {
	_, err := demo.Run(context.Background(), demo.Config{PostgresURL: pgtest.AdminURL(), Region: "mars"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `"mars"`) {
		t.Fatalf("got %v, want an unknown-region error", err)
	}
}
