package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy/faultproxytest"
)

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// roundTrip sends one line over c and returns the echoed line.
func roundTrip(c net.Conn, line string) (string, error) {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

// wantClosed checks that the peer closed c: a read ends with an error other
// than a timeout.
func wantClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("read: got %v, want the connection closed", err)
	}
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCutAndHeal(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))

	before := dial(t, p.Addr())
	if got, err := roundTrip(before, "relay"); err != nil || got != "relay" {
		t.Fatalf("relay: got %q, %v", got, err)
	}

	p.Cut()
	wantClosed(t, before)
	// A new connection is accepted by the kernel but closed by the proxy
	// before anything is relayed.
	during := dial(t, p.Addr())
	if got, err := roundTrip(during, "cut"); err == nil {
		t.Fatalf("while cut: echoed %q", got)
	}
	wantClosed(t, during)

	p.Heal()
	after := dial(t, p.Addr())
	if got, err := roundTrip(after, "healed"); err != nil || got != "healed" {
		t.Fatalf("after heal: got %q, %v", got, err)
	}
	// Heal does not revive what Cut closed.
	if _, err := roundTrip(before, "old"); err == nil {
		t.Fatal("connection closed by Cut relays again after Heal")
	}
}

func TestTrapDropBefore(t *testing.T) {
	p := newProxy(t, faultproxytest.Echo(t))
	c := dial(t, p.Addr())
	p.Trap([]byte("COMMIT"), faultproxy.DropBefore)
	if got, err := roundTrip(c, "hello"); err != nil || got != "hello" {
		t.Fatalf("before trap: got %q, %v", got, err)
	}
	if got, err := roundTrip(c, "COMMIT"); err == nil {
		t.Fatalf("trapped chunk echoed: %q", got)
	}
	if p.Fired() != 1 {
		t.Fatalf("fired %d, want 1", p.Fired())
	}
}

// slowAnswer listens on loopback and answers each line after a delay,
// sending on answered when it began to write the answer. It returns its address.
func slowAnswer(t *testing.T, delay time.Duration, answered chan<- time.Time) string {
	t.Helper()
	return faultproxytest.Serve(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			time.Sleep(delay)
			at := time.Now()
			_, _ = io.WriteString(c, line)
			answered <- at
		}
	})
}

// TestTrapDropAfterAndDropAnswer: both deliver the trapped bytes to the
// server and never its answer; DropAfter cuts the client at once, while
// the server may still be acting on them, and DropAnswer only once the
// server has answered.
func TestTrapDropAfterAndDropAnswer(t *testing.T) {
	const delay = 300 * time.Millisecond
	for _, tc := range []struct {
		name        string
		mode        faultproxy.Mode
		cutBeforeIt bool // the client sees the cut before the server answers
	}{{"DropAfter", faultproxy.DropAfter, true}, {"DropAnswer", faultproxy.DropAnswer, false}} {
		t.Run(tc.name, func(t *testing.T) {
			answered := make(chan time.Time, 4)
			p := newProxy(t, slowAnswer(t, delay, answered))
			c := dial(t, p.Addr())
			if got, err := roundTrip(c, "hello"); err != nil || got != "hello" {
				t.Fatalf("before the trap: got %q, %v", got, err)
			}
			<-answered
			p.Trap([]byte("COMMIT"), tc.mode)
			got, err := roundTrip(c, "COMMIT")
			cut := time.Now()
			if err == nil {
				t.Fatalf("the answer to the trapped bytes reached the client: %q", got)
			}
			var at time.Time
			select {
			case at = <-answered:
			case <-time.After(10 * time.Second):
				t.Fatal("the server never got the trapped bytes")
			}
			if before := cut.Before(at); before != tc.cutBeforeIt {
				t.Fatalf("client saw the cut at %s, the server answered at %s: cut before the answer %v, want %v",
					cut.Format(time.StampMicro), at.Format(time.StampMicro), before, tc.cutBeforeIt)
			}
			if p.Fired() != 1 {
				t.Fatalf("fired %d, want 1", p.Fired())
			}
		})
	}
}
