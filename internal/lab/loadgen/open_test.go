package loadgen

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/api"
)

// TestOpenAccountWaitsForTheAPI: opening an account while the API is down
// (a fault of the run stopped it) is sent again until it listens; the
// request that is refused never reached it, so one account is opened.
func TestOpenAccountWaitsForTheAPI(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // the API is down
	var opened atomic.Int64
	up := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			up <- err
			return
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			opened.Add(1)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"eu-1"}`))
		})}
		t.Cleanup(func() { _ = srv.Close() })
		up <- nil
		_ = srv.Serve(ln)
	}()
	res, err := openAccount(context.Background(), &api.Client{BaseURL: "http://" + addr, APIKey: "k"}, "eu", 0)
	if err != nil || res.Status != http.StatusCreated || opened.Load() != 1 {
		t.Fatalf("got %+v %v with %d accounts opened, want 201 and one account", res, err, opened.Load())
	}
	if err := <-up; err != nil {
		t.Fatal(err)
	}
}
