package pgserver_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgserver"
	"github.com/paymesh/paymesh/platform/pgdb"
)

// TestThrowaway starts a cluster from the local binaries, uses it,
// restarts it in immediate mode on the same URL, and leaves nothing behind.
func TestThrowaway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	tw, err := pgserver.StartThrowaway(ctx)
	if err != nil {
		t.Skipf("no local PostgreSQL binaries: %v", err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("throwaway cluster not reachable: %v", err)
	}
	if _, err := pgdb.Create(ctx, tw.URL, "paymesh_probe", true); err != nil {
		t.Fatal(err)
	}
	if err := tw.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("not reachable after an immediate restart: %v", err)
	}
	if err := tw.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tw.Dir); !os.IsNotExist(err) {
		t.Fatalf("cluster folder %s still exists (%v)", tw.Dir, err)
	}
	if err := pgdb.Reachable(ctx, tw.URL, time.Second); err == nil {
		t.Fatal("the cluster still answers after Stop")
	}
}

// TestThrowawayPort starts a cluster on a fixed port, and refuses a second
// one on the same port with an error that names it.
func TestThrowawayPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	if err := pgserver.Available(); err != nil {
		t.Skipf("no local PostgreSQL binaries: %v", err)
	}
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	tw, err := pgserver.StartThrowawayWith(ctx, pgserver.ThrowawayOptions{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Stop()
	if want := fmt.Sprintf("127.0.0.1:%d/", port); !strings.Contains(tw.URL, want) {
		t.Fatalf("URL %s, want it on %s", tw.URL, want)
	}
	if err := pgdb.Reachable(ctx, tw.URL, 5*time.Second); err != nil {
		t.Fatalf("not reachable on port %d: %v", port, err)
	}
	_, err = pgserver.StartThrowawayWith(ctx, pgserver.ThrowawayOptions{Port: port})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(port)) {
		t.Fatalf("a second cluster on port %d: got %v, want an error naming the port", port, err)
	}
	if _, err := pgserver.StartThrowawayWith(ctx, pgserver.ThrowawayOptions{Port: 70000}); err == nil {
		t.Fatal("port 70000: got no error")
	}
}
