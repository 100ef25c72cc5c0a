package main

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// TestDLQCommands: paymesh dlq connects as the region's operator user,
// lists an empty dead-letter stream, refuses a replay without a target and
// a discard of a sequence nobody knows.
func TestDLQCommands(t *testing.T) {
	ctx := context.Background()
	topo := natsembed.MustStartTopology(t, "eu")
	lu, _ := natsauth.UserOf("eu", natsauth.Ledger)
	nc, err := nats.Connect(topo.ClientURL("eu"), natsauth.ConnectOptions(lu.Name, lu.Password)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := ledgerstream.EnsureStreams(ctx, js, ledgerstream.Topology{Region: "eu"}); err != nil {
		t.Fatal(err)
	}
	f := ledgertest.New(t)
	u, _ := url.Parse(f.URL)
	ou, _ := natsauth.UserOf("eu", natsauth.Ops)
	conn := dlqConn{regionDB: regionDB{Region: "eu", PostgresURL: f.URL, Database: strings.TrimPrefix(u.Path, "/")},
		NATSURL: topo.ClientURL("eu"), natsLogin: natsLogin{NATSUser: ou.Name, NATSPassword: ou.Password}}
	tab, _ := defaultRegions(t)
	log := slog.New(slog.DiscardHandler)
	if err := (&dlqListCmd{dlqConn: conn}).Run(ctx, tab, log); err != nil {
		t.Fatalf("list: %v", err)
	}
	if err := (&dlqReplayCmd{dlqConn: conn, operator: operator{"alice"}}).Run(ctx, tab, log); err == nil {
		t.Fatal("replay without SEQ, filter or --all: no error")
	}
	err = (&dlqDiscardCmd{dlqConn: conn, operator: operator{"alice"}, Seq: 7, Why: "test"}).Run(ctx, tab, log)
	if !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("discard 7: got %v, want dlq.ErrNotFound", err)
	}
}
