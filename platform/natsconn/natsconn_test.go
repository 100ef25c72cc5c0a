package natsconn_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/syncbuf"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/natsconn"
)

// TestConnectRefusedLogin: a wrong password is an authorization error at
// once, not after the wait: retrying will not fix it.
func TestConnectRefusedLogin(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu")
	u, err := natsauth.UserOf("eu", natsauth.Router)
	if err != nil {
		t.Fatal(err)
	}
	cfg := natsconn.Config{URL: topo.ClientURL("eu"), User: u.Name, Password: u.Password, Name: "test", Timeout: 20 * time.Second}
	nc, err := natsconn.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	nc.Close()
	cfg.Password = "wrong"
	began := time.Now()
	if _, err := natsconn.Connect(context.Background(), cfg); !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), cfg.URL) {
		t.Fatalf("wrong password: got %v, want an authorization violation naming %s", err, cfg.URL)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("wrong password: answered after %s, want at once", took)
	}
}

// TestConnectGivesUp: with no server, Connect gives up after its timeout,
// or when its context ends, naming the URL.
func TestConnectGivesUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + ln.Addr().String()
	ln.Close()
	if _, err := natsconn.Connect(context.Background(), natsconn.Config{URL: url, Timeout: 600 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), url+": not reachable within 600ms") {
		t.Fatalf("no server: got %v, want %s: not reachable within 600ms", err, url)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := natsconn.Connect(ctx, natsconn.Config{URL: url, Timeout: time.Minute}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no server, context ends: got %v, want its deadline", err)
	}
}

// TestAsyncErrorsLogged: a publish the user may not make is refused by the
// server outside any call; Connect's handler logs it, naming the
// connection, through the service's logger.
func TestAsyncErrorsLogged(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu")
	u, err := natsauth.UserOf("eu", natsauth.Router)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	nc, err := natsconn.Connect(context.Background(), natsconn.Config{URL: topo.ClientURL("eu"), User: u.Name, Password: u.Password,
		Name: "paymesh-router-eu", Timeout: 20 * time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("paymesh.answers.eu.1", []byte("not the router's")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	want := []string{`msg="nats async error"`, "conn=paymesh-router-eu", "Permissions Violation", "paymesh.answers.eu.1"}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := logs.String()
		missing := ""
		for _, w := range want {
			if !strings.Contains(got, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log after a denied publish: %q, want a line with %q", got, missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
