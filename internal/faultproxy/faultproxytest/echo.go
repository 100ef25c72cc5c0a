// Package faultproxytest holds what tests of links need next to a
// faultproxy: an echo server to relay to.
package faultproxytest

import (
	"io"
	"net"
	"testing"
)

// Echo listens on a random loopback port and echoes every connection's
// bytes back until the test ends. It returns the address, and fails tb if
// it cannot listen.
func Echo(tb testing.TB) string {
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
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}
