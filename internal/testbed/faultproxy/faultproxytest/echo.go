// Package faultproxytest holds what tests of links need next to a
// faultproxy: servers to relay to (an echo, any handler), and a wait for a
// condition.
package faultproxytest

import (
	"io"
	"net"
	"testing"
	"time"
)

// Echo listens on a random loopback port and echoes every connection's
// bytes back until the test ends. It returns the address, and fails tb if
// it cannot listen.
func Echo(tb testing.TB) string {
	tb.Helper()
	return Serve(tb, func(c net.Conn) { io.Copy(c, c) })
}

// Serve listens on a random loopback port and runs handle on each
// connection, closing it afterwards, until the test ends. It returns the
// address, and fails tb if it cannot listen.
func Serve(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// WaitFor polls cond until it holds, and fails tb if it still does not
// after 5 seconds.
func WaitFor(tb testing.TB, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			tb.Fatal("condition not met after 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
