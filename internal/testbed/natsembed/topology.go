package natsembed

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/paymesh/paymesh/internal/platform/natsauth"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
)

const (
	// HubName is the server name of the topology's hub.
	HubName = "hub"
	// leafReconnect is how often a region retries its leafnode link.
	leafReconnect = 250 * time.Millisecond
	// linkWait bounds how long start, Heal and RestartRegion wait for links.
	linkWait = 10 * time.Second
	// readyWait bounds how long a server may take to accept connections.
	readyWait = 10 * time.Second
)

// TopologyOptions configures StartTopology.
type TopologyOptions struct {
	// Regions names one region per server; each is also its JetStream domain.
	Regions []string
	// Dir holds the regions' JetStream store directories (Dir/<region>).
	Dir string
	// Links gives a region's link to the hub a shape (latency, jitter,
	// resets) from the start; a region not named has a plain link.
	// Topology.Link changes it later.
	Links map[string]faultproxy.Shape
	// LinkControl also serves each link's control API (faultproxy.Handler)
	// on a random loopback port: Topology.LinkControlURL.
	LinkControl bool
}

// Topology is paymesh's multi-region NATS layout run in-process on loopback:
// a hub server without JetStream that accepts leafnodes, and one server per
// region with JetStream in its own domain (named after the region) and one
// leafnode remote to the hub. Each region's leafnode link runs through its own
// faultproxy, so a region can be cut off from the others.
//
// The servers have the users and permissions of internal/platform/natsauth, as
// deploy/regions/nats/*.conf: a region's server takes only its services'
// users (natsauth.UserOf, with natsauth.ConnectOptions), the hub takes no
// clients, and each region joins the hub as its leafnode user.
type Topology struct {
	hub     *server.Server
	hubLeaf string // host:port of the hub's leafnode listener

	mu      sync.Mutex
	regions map[string]*regionNode
	order   []string
}

type regionNode struct {
	name     string
	storeDir string
	port     int // client port, kept across restarts
	proxy    *faultproxy.Proxy
	control  *http.Server // the link's control API, or nil
	ctlURL   string
	srv      *server.Server
	cut      bool
}

// StartTopology starts the hub and one server per region, and returns once
// every server accepts connections and every region's leafnode link to the
// hub is up. It returns an error, after stopping whatever it started, when the
// options are invalid or a server or link is not up within 10 seconds.
func StartTopology(o TopologyOptions) (*Topology, error) {
	if len(o.Regions) == 0 {
		return nil, errors.New("natsembed: topology: no regions")
	}
	if o.Dir == "" {
		return nil, errors.New("natsembed: topology: no store directory")
	}
	for i, r := range o.Regions {
		if r == "" || r == HubName || slices.Contains(o.Regions[:i], r) {
			return nil, fmt.Errorf("natsembed: topology: invalid or repeated region name %q", r)
		}
	}
	for r, s := range o.Links {
		if !slices.Contains(o.Regions, r) {
			return nil, fmt.Errorf("natsembed: topology: link shape for %q, which is not a region (regions %v)", r, o.Regions)
		}
		if err := s.Validate(); err != nil {
			return nil, fmt.Errorf("natsembed: topology: link of %s: %w", r, err)
		}
	}
	hubOpts := &server.Options{
		ServerName: HubName,
		Host:       "127.0.0.1",
		Port:       -1,
		LeafNode: server.LeafNodeOpts{
			Host: "127.0.0.1",
			Port: -1,
			// Regions must only ever reach the hub through their proxies:
			// an advertised leafnode URL would let a reconnect bypass them.
			NoAdvertise: true,
		},
		// The hub takes no clients, only the regions' leafnodes.
		Users:  ServerUsers(natsauth.HubUsers()),
		NoSigs: true,
		NoLog:  true,
	}
	hubOpts.LeafNode.Users = ServerUsers(natsauth.LeafUsers(o.Regions))
	hub, err := startServer(hubOpts)
	if err != nil {
		return nil, fmt.Errorf("natsembed: topology: hub: %w", err)
	}
	// The server wrote the leafnode port it picked back into hubOpts before
	// it became ready for connections.
	t := &Topology{
		hub:     hub,
		hubLeaf: "127.0.0.1:" + strconv.Itoa(hubOpts.LeafNode.Port),
		regions: map[string]*regionNode{},
	}
	for _, r := range o.Regions {
		proxy, err := faultproxy.New(t.hubLeaf)
		if err != nil {
			t.Shutdown()
			return nil, fmt.Errorf("natsembed: topology: region %s: %w", r, err)
		}
		proxy.SetShape(o.Links[r])
		n := &regionNode{name: r, storeDir: filepath.Join(o.Dir, r), port: -1, proxy: proxy}
		t.regions[r], t.order = n, append(t.order, r)
		if o.LinkControl {
			if err := n.serveControl(); err != nil {
				t.Shutdown()
				return nil, fmt.Errorf("natsembed: topology: region %s: link control API: %w", r, err)
			}
		}
		if err := t.startRegion(n); err != nil {
			t.Shutdown()
			return nil, fmt.Errorf("natsembed: topology: %w", err)
		}
	}
	for _, r := range t.order {
		if err := t.waitLink(r, true); err != nil {
			t.Shutdown()
			return nil, fmt.Errorf("natsembed: topology: %w", err)
		}
	}
	return t, nil
}

// serveControl serves the control API of n's link on a random loopback
// port.
func (n *regionNode) serveControl() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	n.control = &http.Server{Handler: faultproxy.Handler(n.proxy), ReadHeaderTimeout: 5 * time.Second}
	n.ctlURL = "http://" + ln.Addr().String()
	go n.control.Serve(ln)
	return nil
}

// startServer starts a server from opts and waits until it accepts
// connections.
func startServer(opts *server.Options) (*server.Server, error) {
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("new server %s: %w", opts.ServerName, err)
	}
	go s.Start()
	if !s.ReadyForConnections(readyWait) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("server %s not ready after %s", opts.ServerName, readyWait)
	}
	return s, nil
}

// startRegion starts n's server on its client port (random the first time)
// with its store directory and a leafnode remote through its proxy.
func (t *Topology) startRegion(n *regionNode) error {
	leaf := natsauth.LeafUserName(n.name)
	remote := &url.URL{Scheme: "nats-leaf", Host: n.proxy.Addr(), User: url.UserPassword(leaf, natsauth.DevPassword(leaf))}
	s, err := startServer(&server.Options{
		ServerName:      n.name,
		Host:            "127.0.0.1",
		Port:            n.port,
		JetStream:       true,
		JetStreamDomain: n.name,
		StoreDir:        n.storeDir,
		LeafNode: server.LeafNodeOpts{
			ReconnectInterval: leafReconnect,
			Remotes:           []*server.RemoteLeafOpts{{URLs: []*url.URL{remote}}},
		},
		Users:  ServerUsers(natsauth.Users(n.name)),
		NoSigs: true,
		NoLog:  true,
	})
	if err != nil {
		return fmt.Errorf("region %s: %w", n.name, err)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		s.WaitForShutdown()
		return fmt.Errorf("region %s: JetStream not enabled", n.name)
	}
	n.srv = s
	n.port = s.Addr().(*net.TCPAddr).Port
	return nil
}

// node returns the named region or panics: naming a region the topology was
// not started with is a bug in the caller.
func (t *Topology) node(region string) *regionNode {
	n, ok := t.regions[region]
	if !ok {
		panic(fmt.Sprintf("natsembed: topology has no region %q (regions %v)", region, t.order))
	}
	return n
}

// Regions returns the topology's regions in start order.
func (t *Topology) Regions() []string { return slices.Clone(t.order) }

// Hub returns the hub server.
func (t *Topology) Hub() *server.Server { return t.hub }

// Server returns the region's current server; RestartRegion replaces it. It
// panics on a region the topology does not have.
func (t *Topology) Server(region string) *server.Server {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node(region).srv
}

// ClientURL returns the region's client URL. It stays the same across
// RestartRegion, so clients reconnect to the restarted server. It panics on a
// region the topology does not have.
func (t *Topology) ClientURL(region string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return "nats://127.0.0.1:" + strconv.Itoa(t.node(region).port)
}

// Link returns the proxy that carries the region's leafnode link to the
// hub: SetShape changes its latency, jitter and resets while it runs. Cut
// and Heal go through Topology.Cut and Heal, which also wait for the link.
// It panics on a region the topology does not have.
func (t *Topology) Link(region string) *faultproxy.Proxy {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node(region).proxy
}

// LinkControlURL returns the base URL of the control API of the region's
// link (faultproxy.Handler), or "" unless TopologyOptions.LinkControl was
// set. It panics on a region the topology does not have.
func (t *Topology) LinkControlURL(region string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node(region).ctlURL
}

// LinkUp reports whether the region's leafnode link to the hub is
// established, as seen from both ends. It panics on a region the topology
// does not have.
func (t *Topology) LinkUp(region string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.linkUp(t.node(region))
}

func (t *Topology) linkUp(n *regionNode) bool {
	if n.srv == nil || !n.srv.Running() || n.srv.NumLeafNodes() != 1 {
		return false
	}
	return t.hubSees(n.name)
}

// hubSees reports whether the hub has a leafnode connection from the region.
func (t *Topology) hubSees(region string) bool {
	lz, err := t.hub.Leafz(nil)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(lz.Leafs, func(l *server.LeafInfo) bool { return l.Name == region })
}

// waitLink waits up to linkWait until the region's link is up (up) or
// until neither end sees it any more (!up).
func (t *Topology) waitLink(region string, up bool) error {
	n := t.regions[region]
	deadline := time.Now().Add(linkWait)
	for {
		var ok bool
		if up {
			ok = t.linkUp(n)
		} else {
			ok = !t.hubSees(region) && (n.srv == nil || !n.srv.Running() || n.srv.NumLeafNodes() == 0)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			state := map[bool]string{true: "up", false: "down"}[up]
			return fmt.Errorf("region %s: leafnode link to the hub not %s after %s", region, state, linkWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Cut takes the region's leafnode link down, as a network partition would:
// its connection to the hub is closed and reconnects fail until Heal. Cut
// returns once both ends have dropped the link (or after 10 seconds). The
// region's own server keeps running. It panics on a region the topology does
// not have.
func (t *Topology) Cut(region string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.node(region)
	n.cut = true
	n.proxy.Cut()
	_ = t.waitLink(region, false) // both ends notice a closed socket at once
}

// Heal brings the region's leafnode link back after Cut and waits, at most
// 10 seconds, until the region has reconnected to the hub; LinkUp tells
// whether it did. Subscription interest crosses the new link a moment after
// it is up, so a publish right after Heal may still find no responders:
// retry it. It panics on a region the topology does not have.
func (t *Topology) Heal(region string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.node(region)
	n.cut = false
	n.proxy.Heal()
	if n.srv != nil {
		_ = t.waitLink(region, true)
	}
}

// RestartRegion shuts the region's server down and starts it again on the
// same client port with the same store directory, so its JetStream streams
// and messages survive. Unless the region is cut, it then waits until the
// link to the hub is back. It returns an error when the server does not come
// back or, unless cut, the link does not come back within 10 seconds.
func (t *Topology) RestartRegion(region string) error { return t.RestartRegionAfter(region, 0) }

// RestartRegionAfter is RestartRegion with the server left down for down
// before it starts again: an outage its clients notice.
func (t *Topology) RestartRegionAfter(region string, down time.Duration) error {
	if err := t.stopRegion(region); err != nil {
		return err
	}
	time.Sleep(down)
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.regions[region]
	if err := t.startRegion(n); err != nil {
		return fmt.Errorf("natsembed: restart: %w", err)
	}
	if !n.cut {
		if err := t.waitLink(region, true); err != nil {
			return fmt.Errorf("natsembed: restart: %w", err)
		}
	}
	return nil
}

// stopRegion shuts the region's server down and waits until the hub
// dropped its link.
func (t *Topology) stopRegion(region string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.regions[region]
	if !ok {
		return fmt.Errorf("natsembed: restart region %q: no such region", region)
	}
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		// Let the hub drop the old connection before the new server dials in.
		if err := t.waitLink(region, false); err != nil {
			return fmt.Errorf("natsembed: restart: %w", err)
		}
		n.srv = nil
	}
	return nil
}

// Shutdown stops every server and proxy of the topology and waits until the
// servers have stopped. It is safe to call more than once.
func (t *Topology) Shutdown() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.order {
		n := t.regions[r]
		if n.srv != nil {
			n.srv.Shutdown()
			n.srv.WaitForShutdown()
			n.srv = nil
		}
		if n.control != nil {
			n.control.Close()
		}
		n.proxy.Close()
	}
	if t.hub != nil {
		t.hub.Shutdown()
		t.hub.WaitForShutdown()
	}
}

// MustStartTopology starts a topology with the given regions for a test,
// with store directories under tb.TempDir(), and shuts it down at cleanup.
func MustStartTopology(tb testing.TB, regions ...string) *Topology {
	tb.Helper()
	t, err := StartTopology(TopologyOptions{Regions: regions, Dir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(t.Shutdown)
	return t
}
