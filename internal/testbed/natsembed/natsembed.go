// Package natsembed runs an in-process nats-server with JetStream on
// loopback, for the demo and the tests.
package natsembed

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Options configures an embedded server.
type Options struct {
	// Name of the server; also its JetStream domain-free identity.
	Name string
	// Port is the client port; -1 picks a random free port.
	Port int
	// StoreDir holds JetStream file storage.
	StoreDir string
}

// Start starts a server and waits until it accepts connections. It returns
// an error when it cannot start in 10 seconds.
func Start(o Options) (*server.Server, error) {
	if o.Port == 0 {
		o.Port = -1
	}
	s, err := server.NewServer(&server.Options{
		ServerName: o.Name,
		Host:       "127.0.0.1",
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(readyWait) {
		s.Shutdown()
		return nil, fmt.Errorf("natsembed: server not ready after %s", readyWait)
	}
	return s, nil
}

// MustStart starts a server for a test, stopped at cleanup, and returns a
// connection to it.
func MustStart(tb testing.TB) (*server.Server, *nats.Conn) {
	tb.Helper()
	s, err := Start(Options{Name: "test", StoreDir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		s.Shutdown()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		nc.Close()
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s, nc
}
