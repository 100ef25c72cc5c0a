package faultproxy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy/faultproxytest"
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

// TestLatencyIsADelayLine sends 4 MiB each way through a link of 50 ms: a
// delay line carries it in about the latency plus the copying; a proxy that
// slept the latency per chunk read (32 KiB) would take 128 × 2 × 50 ms.
func TestLatencyIsADelayLine(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	p.SetShape(faultproxy.Shape{Latency: 50 * time.Millisecond})
	c := dial(t, p.Addr())
	data := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
	start := time.Now()
	go c.Write(data)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(data))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("echoed bytes differ")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("4 MiB through a 50 ms link took %s, want well under 3s: the latency must not cap throughput", took)
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
	// A reset already under way when the shape was cleared may land after
	// the first Status (a fresh-clone run: 24 RSTs, 23 counted): compare
	// with the count once every connection has been read.
	if final := p.Status().Resets; rst != int(final) {
		t.Fatalf("connections reset with RST: got %d, want %d", rst, final)
	}
}

func TestStatus(t *testing.T) {
	target := faultproxytest.Echo(t)
	p := newProxy(t, target)
	// A reset rate that shows in the status but, at one in a thousand
	// seconds, does not cut the round trip below (0.5 did, once in CI).
	shape := faultproxy.Shape{Latency: time.Millisecond, Jitter: time.Microsecond, ResetRate: 0.001}
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
	faultproxytest.WaitFor(t, func() bool { return p.Status().Conns == 0 })
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
