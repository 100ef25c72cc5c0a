package natsconn_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/platform/natsauth"
	"github.com/paymesh/paymesh/internal/platform/natsconn"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
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
