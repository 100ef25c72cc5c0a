// Package faultproxy is a loopback TCP proxy for fault tests. It relays
// connections to a target and can cut every connection at the moment a given
// byte pattern passes from client to server: either before the pattern is
// delivered (the server never sees it) or right after (the server acts on it
// but the client never hears the answer). It can also take the whole link
// down (Cut) and bring it back (Heal), to simulate a network partition.
package faultproxy

import (
	"bytes"
	"fmt"
	"net"
	"sync"
)

// Mode says when a trap fires relative to the trapped bytes.
type Mode int

const (
	// DropBefore closes the connection without delivering the bytes.
	DropBefore Mode = iota + 1
	// DropAfter delivers the bytes, then closes before any answer returns.
	DropAfter
)

// Proxy relays TCP connections from Addr to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	trap  []byte
	mode  Mode
	fired int
	down  bool
	conns map[net.Conn]struct{}
}

// New listens on a random loopback port and relays to target. It returns an
// error if it cannot listen.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

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
	for c := range p.conns {
		c.Close()
	}
}

// Heal brings the link back up after Cut: new connections are relayed again.
// Connections closed by Cut stay closed; their clients have to reconnect.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Close stops listening and closes every relayed connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	return err
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
		p.mu.Lock()
		if p.down {
			// Cut while dialing: this connection belongs to the broken link.
			p.mu.Unlock()
			client.Close()
			server.Close()
			continue
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go p.pipe(client, server, true)
		go p.pipe(server, client, false)
	}
}

func (p *Proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

func (p *Proxy) pipe(from, to net.Conn, upstream bool) {
	closeTo := true
	defer func() {
		from.Close()
		if closeTo {
			to.Close()
		}
		p.mu.Lock()
		delete(p.conns, from)
		delete(p.conns, to)
		p.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			mode := Mode(0)
			if upstream {
				mode = p.check(chunk)
			}
			if mode == DropBefore {
				return
			}
			if _, werr := to.Write(chunk); werr != nil {
				return
			}
			if mode == DropAfter {
				// Cut the client off but leave the server connection to the
				// other direction's relay: it closes once the server answers,
				// so the server surely acted on the bytes.
				closeTo = false
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) check(chunk []byte) Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trap == nil || !bytes.Contains(chunk, p.trap) {
		return 0
	}
	p.trap = nil
	p.fired++
	return p.mode
}
