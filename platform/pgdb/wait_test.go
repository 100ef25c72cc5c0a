package pgdb_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/platform/pgdb"
)

// TestWait: a reachable database answers at once; a database that does not
// exist is an error at once (waiting will not create it); a server that
// does not answer is an error after the timeout, or when ctx ends.
func TestWait(t *testing.T) {
	ctx := context.Background()
	_, url := pgtest.MustDatabase(t)
	if err := pgdb.Wait(ctx, url, time.Minute, nil); err != nil {
		t.Fatalf("reachable: %v", err)
	}
	missing, err := pgdb.WithDatabase(pgtest.AdminURL(), "pmtest_no_such_database")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := pgdb.Wait(ctx, missing, time.Minute, nil); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing database: got %v, want does not exist", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("missing database: answered after %s, want at once", took)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "postgres://postgres@" + ln.Addr().String() + "/x?sslmode=disable"
	ln.Close()
	if err := pgdb.Wait(ctx, down, 600*time.Millisecond, nil); err == nil || !strings.Contains(err.Error(), "not reachable within 600ms") {
		t.Fatalf("no server: got %v, want not reachable within 600ms", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := pgdb.Wait(cctx, down, time.Minute, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no server, context ends: got %v, want its deadline", err)
	}
}
