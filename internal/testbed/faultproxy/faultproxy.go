// Package faultproxy is a TCP proxy that plays a network link: paymesh's
// WAN link between a region's nats-server and the hub (paymesh-lab wan), and the
// loopback links of the fault tests.
//
// A Proxy relays every connection to its target through a shaped link
// (Shape): each chunk read on one side is delivered on the other a one-way
// latency (plus jitter) later, in order, without capping throughput, and
// live connections are reset at a given rate. The whole link can be taken
// down (Cut) and brought back (Heal), as in a network partition. For fault
// tests it can also cut every connection at the moment a given byte pattern
// passes from client to server (Trap): either before the pattern is delivered
// (the server never sees it) or right after (the server acts on it but the
// client never hears the answer).
//
// Handler serves a small HTTP control API for a Proxy, and Client talks to
// it.
package faultproxy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode says when a trap fires relative to the trapped bytes.
type Mode int

const (
	// DropBefore closes the connection without delivering the bytes.
	DropBefore Mode = iota + 1
	// DropAfter delivers the bytes, then closes the client's side at
	// once: the client learns of the cut while the server may still be
	// acting on them.
	DropAfter
	// DropAnswer delivers the bytes, then closes the connection when the
	// answer returns, without delivering it: the server has acted on the
	// bytes before the client learns that the connection is gone.
	DropAnswer
)

const (
	// chunkSize is the most bytes read at once from one side.
	chunkSize = 32 << 10
	// queueLen bounds the chunks in flight per direction of a connection:
	// with latency, up to queueLen*chunkSize bytes are on the wire.
	queueLen = 256
)

// Proxy relays TCP connections from Addr to a target.
type Proxy struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by Close
	wake   chan struct{} // SetShape wakes the reset loop

	mu       sync.Mutex
	shape    Shape
	trap     []byte
	mode     Mode
	fired    int
	down     bool
	closed   bool
	links    map[*link]struct{}
	accepted int64
	resets   int64
}

// link is one relayed connection: the client's side and the target's.
type link struct {
	client, server net.Conn
	once           sync.Once
	// answerLost is set when a DropAnswer chunk goes to the server: the
	// server's next bytes close the link instead of reaching the client.
	answerLost atomic.Bool
}

// New listens on a random loopback port and relays to target. It returns an
// error if it cannot listen.
func New(target string) (*Proxy, error) { return Listen("127.0.0.1:0", target) }

// Listen listens on addr (host:port; port 0 picks one) and relays every
// connection to target, with no latency until SetShape. It returns an error
// if it cannot listen.
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, done: make(chan struct{}), wake: make(chan struct{}, 1), links: map[*link]struct{}{}}
	go p.serve()
	go p.resetLoop()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy relays to.
func (p *Proxy) Target() string { return p.target }

// SetShape sets the link's latency, jitter and reset rate. It applies to
// chunks read from now on, in new and live connections alike. Negative
// values count as zero; Shape.Validate tells a caller about them.
func (p *Proxy) SetShape(s Shape) {
	s.Latency, s.Jitter, s.ResetRate = max(s.Latency, 0), max(s.Jitter, 0), max(s.ResetRate, 0)
	p.mu.Lock()
	p.shape = s
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Shape returns the link's current shape.
func (p *Proxy) Shape() Shape {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.shape
}

// Status returns the link's address, shape and counters.
func (p *Proxy) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Status{Listen: p.Addr(), Target: p.target, Shape: p.shape, Cut: p.down,
		Conns: len(p.links), Accepted: p.accepted, Resets: p.resets}
}

// Trap arms a one-shot trap: the next client→server chunk containing
// pattern fires it with mode.
func (p *Proxy) Trap(pattern []byte, mode Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trap, p.mode = pattern, mode
}

// Fired returns how many traps have fired.
func (p *Proxy) Fired() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fired
}

// Cut takes the link down: it closes every relayed connection, and until
// Heal every new connection is accepted and closed at once, so a dialer sees
// its connection reset or closed as on a broken link.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for l := range p.links {
		l.close()
	}
}

// Heal brings the link back up after Cut: new connections are relayed again.
// Connections closed by Cut stay closed; their clients have to reconnect.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Close stops listening and closes every relayed connection. It returns the
// listener's close error; calling it again returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	return p.ln.Close()
}

func (p *Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.isDown() {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		l := &link{client: client, server: server}
		p.mu.Lock()
		if p.down || p.closed {
			// Cut while dialing: this connection belongs to the broken link.
			p.mu.Unlock()
			l.close()
			continue
		}
		p.links[l] = struct{}{}
		p.accepted++
		p.mu.Unlock()
		go p.relay(l, client, server, true)
		go p.relay(l, server, client, false)
	}
}

func (p *Proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// close closes both sides of the link once.
func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		l.server.Close()
	})
}

// reset closes both sides of the link with a TCP RST instead of a FIN, as a
// broken middlebox or a peer's crash would.
func (l *link) reset() {
	for _, c := range []net.Conn{l.client, l.server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	}
	l.close()
}

func (p *Proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// chunk is bytes read from one side, due on the other side at due. after is
// DropAfter or DropAnswer when the chunk fired that trap.
type chunk struct {
	data  []byte
	due   time.Time
	after Mode
}

// relay moves bytes from one side of l to the other through a delay line:
// this goroutine reads and stamps each chunk with its due time, a second one
// writes it when due. The due times never decrease, so jitter never
// reorders bytes.
func (p *Proxy) relay(l *link, from, to net.Conn, upstream bool) {
	q := make(chan chunk, queueLen)
	writerDone := make(chan struct{})
	go p.deliver(l, from, to, q, writerDone)
	defer close(q)
	var last time.Time
	buf := make([]byte, chunkSize)
	for {
		n, err := from.Read(buf)
		if n > 0 && !upstream && l.answerLost.Load() {
			p.forget(l) // the answer to a DropAnswer chunk: lost
			return
		}
		if n > 0 {
			c := chunk{data: bytes.Clone(buf[:n])} // buf is read into again while c waits
			if upstream {
				c.after = p.check(c.data)
			}
			if c.after == DropBefore {
				p.forget(l)
				return
			}
			c.due = p.due(time.Now())
			if c.due.Before(last) {
				c.due = last
			}
			last = c.due
			select {
			case q <- c:
			case <-writerDone:
				return
			}
			if c.after == DropAfter || c.after == DropAnswer {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// deliver writes the chunks of q to to as they fall due. When q ends it
// closes the link. After a DropAfter chunk it closes only from (the
// client), leaving the server's side to the other direction's relay, which
// closes it once the server answers, so the server surely acted on the
// bytes. After a DropAnswer chunk it leaves the whole link to that relay,
// so the client sees the cut only once the server has answered.
func (p *Proxy) deliver(l *link, from, to net.Conn, q <-chan chunk, done chan<- struct{}) {
	defer close(done)
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				p.forget(l)
				return
			}
		}
		if c.after == DropAnswer {
			// Before the write: the server's answer, however fast, finds
			// it set.
			l.answerLost.Store(true)
		}
		if _, err := to.Write(c.data); err != nil {
			p.forget(l)
			return
		}
		switch c.after {
		case DropAfter:
			from.Close()
			return
		case DropAnswer:
			return // the other direction closes the link on the answer
		}
	}
	p.forget(l)
}

// due returns when a chunk read at now is delivered: after the latency plus
// a uniform jitter in [-Jitter, +Jitter], never before now.
func (p *Proxy) due(now time.Time) time.Time {
	p.mu.Lock()
	s := p.shape
	p.mu.Unlock()
	d := s.Latency
	if s.Jitter > 0 {
		d += time.Duration(rand.Int64N(int64(2*s.Jitter)+1)) - s.Jitter
	}
	return now.Add(max(d, 0))
}

func (p *Proxy) check(data []byte) Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trap == nil || !bytes.Contains(data, p.trap) {
		return 0
	}
	p.trap = nil
	p.fired++
	return p.mode
}

// resetLoop resets a random live connection at the shape's reset rate: the
// waits between resets are exponentially distributed (a Poisson process), so
// resets come at random moments but ResetRate per second on average. A reset
// due while no connection is live is skipped.
func (p *Proxy) resetLoop() {
	for {
		rate := p.Shape().ResetRate
		var t *time.Timer
		var tick <-chan time.Time
		if rate > 0 {
			t = time.NewTimer(time.Duration(rand.ExpFloat64() / rate * float64(time.Second)))
			tick = t.C
		}
		select {
		case <-p.done:
		case <-p.wake:
		case <-tick:
			p.resetOne()
		}
		if t != nil {
			t.Stop()
		}
		select {
		case <-p.done:
			return
		default:
		}
	}
}

func (p *Proxy) resetOne() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.links) == 0 {
		return
	}
	i := rand.IntN(len(p.links))
	for l := range p.links {
		if i == 0 {
			l.reset()
			delete(p.links, l)
			p.resets++
			return
		}
		i--
	}
}
