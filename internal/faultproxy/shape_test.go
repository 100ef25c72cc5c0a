package faultproxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/faultproxy"
	"github.com/paymesh/paymesh/internal/faultproxy/faultproxytest"
)

func TestLatencyRoundTrip(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	const lat = 50 * time.Millisecond
	p.SetShape(faultproxy.Shape{Latency: lat})
	c := dial(t, p.Addr())
	for i := range 3 {
		start := time.Now()
		if got, err := roundTrip(c, "ping"); err != nil || got != "ping" {
			t.Fatalf("round trip %d: got %q, %v", i, got, err)
		}
		// The request and the answer each wait the one-way latency.
		if took := time.Since(start); took < 2*lat || took > 2*lat+time.Second {
			t.Fatalf("round trip %d took %s, want at least %s (and not a second more)", i, took, 2*lat)
		}
	}
}

// TestLatencyIsADelayLine sends a line every 10 ms for 400 ms through a
// link of 100 ms: a delay line answers them all about 200 ms after the last
// one; a proxy that slept the latency per chunk would take 40 × 200 ms.
func TestLatencyIsADelayLine(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	p.SetShape(faultproxy.Shape{Latency: 100 * time.Millisecond})
	c := dial(t, p.Addr())
	const lines = 40
	start := time.Now()
	go func() {
		for i := range lines {
			fmt.Fprintf(c, "%d\n", i)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	for i := range lines {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("%d lines 10 ms apart took %s through a 100 ms link, want well under 2s", lines, took)
	}
}

func TestJitterKeepsByteOrder(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	p.SetShape(faultproxy.Shape{Latency: 5 * time.Millisecond, Jitter: 5 * time.Millisecond})
	c := dial(t, p.Addr())
	const n = 20000
	go func() {
		w := bufio.NewWriterSize(c, 512) // many small writes, so many chunks
		for i := range n {
			fmt.Fprintf(w, "%d\n", i)
		}
		w.Flush()
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	for i := range n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if got, _ := strconv.Atoi(line[:len(line)-1]); got != i {
			t.Fatalf("line %d: got %q, want %d: bytes reordered", i, line, i)
		}
	}
}

func TestResetRate(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	var conns []net.Conn
	for i := range 30 {
		c := dial(t, p.Addr())
		if _, err := roundTrip(c, "up"); err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	p.SetShape(faultproxy.Shape{ResetRate: 20})
	time.Sleep(time.Second)
	p.SetShape(faultproxy.Shape{})
	st := p.Status()
	// 20/s for 1 s is a Poisson count with mean 20: below 5 has odds of
	// about 1 in 60000; above 40 is as unlikely.
	if st.Resets < 5 || st.Resets > 40 {
		t.Fatalf("resets after 1 s at 20/s: got %d, want about 20", st.Resets)
	}
	if st.Conns != 30-int(st.Resets) {
		t.Fatalf("live conns: got %d, want 30 - %d resets", st.Conns, st.Resets)
	}
	// The reset connections see a TCP reset, not an orderly close.
	rst := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, syscall.ECONNRESET) {
			rst++
		}
	}
	if rst != int(st.Resets) {
		t.Fatalf("connections reset with RST: got %d, want %d", rst, st.Resets)
	}
}

func TestStatus(t *testing.T) {
	target := faultproxytest.Echo(t)
	p := newProxy(t, target)
	shape := faultproxy.Shape{Latency: time.Millisecond, Jitter: time.Microsecond, ResetRate: 0.5}
	p.SetShape(shape)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "x"); err != nil {
		t.Fatal(err)
	}
	want := faultproxy.Status{Listen: p.Addr(), Target: target, Shape: shape, Conns: 1, Accepted: 1}
	if got := p.Status(); got != want {
		t.Fatalf("status: got %+v, want %+v", got, want)
	}
	c.Close()
	p.Cut()
	waitFor(t, func() bool { return p.Status().Conns == 0 })
	if got := p.Status(); !got.Cut || got.Accepted != 1 {
		t.Fatalf("after cut: got %+v, want cut with 1 accepted", got)
	}
}

func TestShapeValidate(t *testing.T) {
	for _, s := range []faultproxy.Shape{{Latency: -1}, {Jitter: -1}, {ResetRate: -1}, {ResetRate: faultproxy.MaxResetRate + 1}} {
		if err := s.Validate(); err == nil {
			t.Errorf("%v: valid, want an error", s)
		}
	}
	if err := (faultproxy.Shape{Latency: time.Second, Jitter: time.Millisecond, ResetRate: 3}).Validate(); err != nil {
		t.Errorf("valid shape: %v", err)
	}
}

// waitFor polls cond for up to 5 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met after 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
