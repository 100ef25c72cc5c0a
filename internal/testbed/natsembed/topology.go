package natsembed

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/platform/natsauth"
)

const (
	// HubName is the server name of the topology's hub.
	HubName = "hub"
	// leafReconnect is how often a region retries its leafnode link.
	leafReconnect = 250 * time.Millisecond
	// linkWait bounds how long start, Heal and RestartRegion wait for
	// links: generous, as a loaded machine (a test run beside a CPU hog)
	// takes seconds where an idle one takes milliseconds.
	linkWait = 30 * time.Second
	// readyWait bounds how long a server may take to accept connections
	// (as generous, for the same reason).
	readyWait = time.Minute
	// jetStreamWait bounds how long start, RestartRegion and StartNode
	// wait for a region's JetStream to answer: a cluster's meta leader
	// election.
	jetStreamWait = 30 * time.Second
	// clusterNodes is the one cluster size the topology runs besides a
	// single server.
	clusterNodes = 3
)

// TopologyOptions configures StartTopology.
type TopologyOptions struct {
	// Regions names one region per server; each is also its JetStream domain.
	Regions []string
	// Dir holds the regions' JetStream store directories: Dir/<region> for
	// a single server, Dir/<region>-<n> for the nodes of a cluster.
	Dir string
	// Nodes is how many nats-servers each region runs: 0 or 1 for one
	// server named after the region, 3 for a JetStream cluster of three
	// (servers <region>-1 to <region>-3, cluster name and JetStream domain
	// the region). Other counts are refused.
	Nodes int
	// RegionNodes overrides Nodes for the regions it names (1 or 3 each),
	// so that one region runs a cluster while the others run one server.
	RegionNodes map[string]int
	// Links gives a region's link to the hub a shape (latency, jitter,
	// resets) from the start; a region not named has a plain link.
	// Topology.Link changes it later.
	Links map[string]faultproxy.Shape
	// LinkControl also serves each link's control API (faultproxy.Handler)
	// on a random loopback port: Topology.LinkControlURL.
	LinkControl bool
}

// Topology is paymesh's multi-region NATS layout run in-process on loopback:
// a hub server without JetStream that accepts leafnodes, and per region
// either one server or a cluster of three, with JetStream in the region's own
// domain (named after the region). Every server of a region has a leafnode
// remote to the hub, and all of them run through the region's one
// faultproxy, so a region can be cut off from the others as a whole.
//
// The nodes of a region are numbered from 0: node i is the server named
// NodeName(region, i), "<region>-<i+1>" in a cluster and "<region>" alone.
//
// The servers have the users and permissions of platform/natsauth, as
// deploy/regions/nats/*.conf: a region's servers take only its services'
// users (natsauth.UserOf, with natsauth.ConnectOptions), the hub takes no
// clients, and each region joins the hub as its leafnode user.
type Topology struct {
	hub     *server.Server
	hubLeaf string // host:port of the hub's leafnode listener

	mu      sync.Mutex
	regions map[string]*region
	order   []string
}

// region is one region's servers and its link to the hub.
type region struct {
	name    string
	proxy   *faultproxy.Proxy
	control *http.Server // the link's control API, or nil
	ctlURL  string
	cut     bool
	nodes   []*node
}

// node is one nats-server of a region.
type node struct {
	name     string
	storeDir string
	port     int   // client port, chosen at the first start and kept
	routes   []int // the cluster's route ports, this node's at index own; nil alone
	own      int
	srv      *server.Server // nil while stopped
}

func (n *node) running() bool { return n.srv != nil && n.srv.Running() }

// StartTopology starts the hub and every region's servers, and returns once
// every server accepts connections, every region's leafnode links to the
// hub are up and every region's JetStream answers (a cluster has elected its
// meta leader and knows all its peers). It returns an error, after stopping
// whatever it started, when the options are invalid, or a server or link is
// not up within 10 seconds, or JetStream does not answer within 30.
func StartTopology(o TopologyOptions) (*Topology, error) {
	if len(o.Regions) == 0 {
		return nil, errors.New("natsembed: topology: no regions")
	}
	if o.Dir == "" {
		return nil, errors.New("natsembed: topology: no store directory")
	}
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes != 1 && o.Nodes != clusterNodes {
		return nil, fmt.Errorf("natsembed: topology: %d nodes per region: want 1 (one server) or %d (a JetStream cluster)", o.Nodes, clusterNodes)
	}
	for i, r := range o.Regions {
		if r == "" || r == HubName || slices.Contains(o.Regions[:i], r) {
			return nil, fmt.Errorf("natsembed: topology: invalid or repeated region name %q", r)
		}
	}
	for r, n := range o.RegionNodes {
		if !slices.Contains(o.Regions, r) {
			return nil, fmt.Errorf("natsembed: topology: nodes for %q, which is not a region (regions %v)", r, o.Regions)
		}
		if n != 1 && n != clusterNodes {
			return nil, fmt.Errorf("natsembed: topology: %d nodes in region %s: want 1 (one server) or %d (a JetStream cluster)", n, r, clusterNodes)
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
		regions: map[string]*region{},
	}
	fail := func(err error) (*Topology, error) {
		t.Shutdown()
		return nil, fmt.Errorf("natsembed: topology: %w", err)
	}
	for _, r := range o.Regions {
		proxy, err := faultproxy.New(t.hubLeaf)
		if err != nil {
			return fail(fmt.Errorf("region %s: %w", r, err))
		}
		proxy.SetShape(o.Links[r])
		g := &region{name: r, proxy: proxy}
		t.regions[r], t.order = g, append(t.order, r)
		count := o.Nodes
		if n, ok := o.RegionNodes[r]; ok {
			count = n
		}
		if g.nodes, err = newNodes(r, o.Dir, count); err != nil {
			return fail(fmt.Errorf("region %s: %w", r, err))
		}
		if o.LinkControl {
			if err := g.serveControl(); err != nil {
				return fail(fmt.Errorf("region %s: link control API: %w", r, err))
			}
		}
		for _, n := range g.nodes {
			if err := t.startNode(g, n); err != nil {
				return fail(err)
			}
		}
	}
	for _, r := range t.order {
		if err := t.waitLink(t.regions[r], true); err != nil {
			return fail(err)
		}
	}
	for _, r := range t.order {
		if err := t.waitJetStream(t.regions[r]); err != nil {
			return fail(err)
		}
	}
	return t, nil
}

// newNodes makes a region's nodes: one named after the region, or a
// cluster with route ports chosen now, since every node lists them all.
func newNodes(region, dir string, count int) ([]*node, error) {
	if count == 1 {
		return []*node{{name: region, storeDir: filepath.Join(dir, region), port: -1}}, nil
	}
	routes, err := freePorts(count)
	if err != nil {
		return nil, fmt.Errorf("route ports: %w", err)
	}
	nodes := make([]*node, count)
	for i := range nodes {
		name := nodeName(region, count, i)
		nodes[i] = &node{name: name, storeDir: filepath.Join(dir, name), port: -1, routes: routes, own: i}
	}
	return nodes, nil
}

// nodeName names node i of a region of count nodes.
func nodeName(region string, count, i int) string {
	if count == 1 {
		return region
	}
	return region + "-" + strconv.Itoa(i+1)
}

// freePorts returns n loopback ports that were free a moment ago, all held
// open together so they differ.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// serveControl serves the control API of n's link on a random loopback
// port.
func (n *region) serveControl() error {
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

// startNode starts n on its client port (random the first time) with its
// store directory, its cluster routes if it has any, and a leafnode remote
// through g's proxy. The caller holds t.mu or owns t alone.
func (t *Topology) startNode(g *region, n *node) error {
	leaf := natsauth.LeafUserName(g.name)
	remote := &url.URL{Scheme: "nats-leaf", Host: g.proxy.Addr(), User: url.UserPassword(leaf, natsauth.DevPassword(leaf))}
	opts := &server.Options{
		ServerName:      n.name,
		Host:            "127.0.0.1",
		Port:            n.port,
		JetStream:       true,
		JetStreamDomain: g.name,
		StoreDir:        n.storeDir,
		LeafNode: server.LeafNodeOpts{
			ReconnectInterval: leafReconnect,
			// Every node has its own link: a stream leader on any node
			// answers publishes from other regions, and the region keeps
			// its link while one node is down.
			Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{remote}}},
		},
		Users:  ServerUsers(natsauth.Users(g.name)),
		NoSigs: true,
		NoLog:  true,
	}
	if n.routes != nil {
		opts.Cluster = server.ClusterOpts{Name: g.name, Host: "127.0.0.1", Port: n.routes[n.own]}
		for _, p := range n.routes {
			opts.Routes = append(opts.Routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
		}
	}
	s, err := startServer(opts)
	if err != nil {
		return fmt.Errorf("region %s: %w", g.name, err)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		s.WaitForShutdown()
		return fmt.Errorf("region %s: server %s: JetStream not enabled", g.name, n.name)
	}
	n.srv = s
	n.port = s.Addr().(*net.TCPAddr).Port
	return nil
}

// region returns the named region or panics: naming a region the topology
// was not started with is a bug in the caller.
func (t *Topology) region(name string) *region {
	g, ok := t.regions[name]
	if !ok {
		panic(fmt.Sprintf("natsembed: topology has no region %q (regions %v)", name, t.order))
	}
	return g
}

// lookup returns the named region and its node i, or an error naming what
// the topology does not have.
func (t *Topology) lookup(name string, i int) (*region, *node, error) {
	g, ok := t.regions[name]
	if !ok {
		return nil, nil, fmt.Errorf("natsembed: no region %q (regions %v)", name, t.order)
	}
	if i < 0 || i >= len(g.nodes) {
		return nil, nil, fmt.Errorf("natsembed: region %s has no node %d (nodes 0 to %d)", name, i, len(g.nodes)-1)
	}
	return g, g.nodes[i], nil
}

// Regions returns the topology's regions in start order.
func (t *Topology) Regions() []string { return slices.Clone(t.order) }

// Hub returns the hub server.
func (t *Topology) Hub() *server.Server { return t.hub }

// Server returns the current server of the region's node 0 (the region's
// only server unless it is a cluster), or nil while it is stopped;
// RestartRegion and StartNode replace it. It panics on a region the topology
// does not have.
func (t *Topology) Server(region string) *server.Server { return t.NodeServer(region, 0) }

// NodeServer returns the current server of the region's node i, or nil
// while it is stopped. It panics on a region or node the topology does not
// have.
func (t *Topology) NodeServer(region string, i int) *server.Server {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, n, err := t.lookup(region, i)
	if err != nil {
		panic(err.Error())
	}
	return n.srv
}

// Nodes returns how many servers the region runs: 1, or 3 for a cluster. It
// panics on a region the topology does not have.
func (t *Topology) Nodes(region string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.region(region).nodes)
}

// NodeName returns the server name of the region's node i: the region's
// name for a single server, "<region>-<i+1>" in a cluster. It panics on a
// region or node the topology does not have.
func (t *Topology) NodeName(region string, i int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, n, err := t.lookup(region, i)
	if err != nil {
		panic(err.Error())
	}
	return n.name
}

// Replicas returns the replica count the region's streams should have: one
// per server, 1 for a single server and 3 for a cluster. It panics on a
// region the topology does not have.
func (t *Topology) Replicas(region string) int { return t.Nodes(region) }

// ClientURL returns the client URLs of all the region's servers, comma-
// separated as nats.Connect takes them, so a client moves to another node
// when one stops. It stays the same across RestartRegion and StartNode. It
// panics on a region the topology does not have.
func (t *Topology) ClientURL(region string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.clientURL(t.region(region))
}

func (t *Topology) clientURL(g *region) string {
	urls := make([]string, len(g.nodes))
	for i, n := range g.nodes {
		urls[i] = "nats://127.0.0.1:" + strconv.Itoa(n.port)
	}
	return strings.Join(urls, ",")
}

// Link returns the proxy that carries the region's leafnode links to the
// hub: SetShape changes its latency, jitter and resets while it runs. Cut
// and Heal go through Topology.Cut and Heal, which also wait for the links.
// It panics on a region the topology does not have.
func (t *Topology) Link(region string) *faultproxy.Proxy {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.region(region).proxy
}

// LinkControlURL returns the base URL of the control API of the region's
// link (faultproxy.Handler), or "" unless TopologyOptions.LinkControl was
// set. It panics on a region the topology does not have.
func (t *Topology) LinkControlURL(region string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.region(region).ctlURL
}

// LinkUp reports whether the region's leafnode links to the hub are
// established: every running server of the region has its link, and the hub
// sees each of them. It is false while none of the region's servers runs. It
// panics on a region the topology does not have.
func (t *Topology) LinkUp(region string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.linkUp(t.region(region))
}

func (t *Topology) linkUp(g *region) bool {
	seen := t.hubSees()
	up := 0
	for _, n := range g.nodes {
		if !n.running() {
			continue
		}
		if n.srv.NumLeafNodes() != 1 || !seen[n.name] {
			return false
		}
		up++
	}
	return up > 0
}

// linkDown reports whether neither end sees any of g's links.
func (t *Topology) linkDown(g *region) bool {
	seen := t.hubSees()
	for _, n := range g.nodes {
		if seen[n.name] || (n.running() && n.srv.NumLeafNodes() != 0) {
			return false
		}
	}
	return true
}

// hubSees returns the server names of the hub's leafnode connections.
func (t *Topology) hubSees() map[string]bool {
	lz, err := t.hub.Leafz(nil)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	for _, l := range lz.Leafs {
		seen[l.Name] = true
	}
	return seen
}

// waitLink waits up to linkWait until the region's links are up (up) or
// until neither end sees any of them (!up).
func (t *Topology) waitLink(g *region, up bool) error {
	return waitFor(linkWait, func() bool {
		if up {
			return t.linkUp(g)
		}
		return t.linkDown(g)
	}, func() error {
		state := map[bool]string{true: "up", false: "down"}[up]
		return fmt.Errorf("region %s: leafnode links to the hub not %s after %s", g.name, state, linkWait)
	})
}

// waitNodeLink waits up to linkWait until n's link is up and the hub sees
// it (up), or the hub no longer sees it (!up).
func (t *Topology) waitNodeLink(g *region, n *node, up bool) error {
	return waitFor(linkWait, func() bool {
		if up {
			return n.running() && n.srv.NumLeafNodes() == 1 && t.hubSees()[n.name]
		}
		return !t.hubSees()[n.name]
	}, func() error {
		state := map[bool]string{true: "up", false: "down"}[up]
		return fmt.Errorf("region %s: leafnode link of %s not %s after %s", g.name, n.name, state, linkWait)
	})
}

// waitFor polls ok every 10 ms until it holds, or returns late() after
// within.
func waitFor(within time.Duration, ok func() bool, late func() error) error {
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			return late()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// waitJetStream waits up to jetStreamWait until the region's JetStream is
// usable: in a cluster every running node knows the meta leader, which
// sees every other running node as a current peer; and a $JS.API.INFO
// request through the region's client URLs answers.
func (t *Topology) waitJetStream(g *region) error {
	deadline := time.Now().Add(jetStreamWait)
	late := func(err error) error {
		return fmt.Errorf("region %s: JetStream not usable after %s: %w", g.name, jetStreamWait, err)
	}
	for {
		err := metaReady(g)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return late(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ops, err := natsauth.UserOf(g.name, natsauth.Ops)
	if err != nil {
		return err
	}
	for {
		err := accountInfo(t.clientURL(g), ops, time.Until(deadline))
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return late(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metaReady returns nil once every running node of g knows the meta
// leader and the leader sees the other running nodes as current peers; at
// once for a single server.
func metaReady(g *region) error {
	if len(g.nodes) == 1 {
		return nil
	}
	running := map[string]bool{}
	var leader *node
	for _, n := range g.nodes {
		if !n.running() {
			continue
		}
		running[n.name] = true
		jsz, err := n.srv.Jsz(&server.JSzOptions{})
		if err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
		if jsz.Meta == nil || jsz.Meta.Leader == "" {
			return fmt.Errorf("%s: no meta leader", n.name)
		}
		if n.srv.JetStreamIsLeader() {
			leader = n
		}
	}
	if leader == nil {
		return errors.New("no running node is the meta leader")
	}
	jsz, err := leader.srv.Jsz(&server.JSzOptions{})
	if err != nil || jsz.Meta == nil {
		return fmt.Errorf("%s: meta cluster info: %v", leader.name, err)
	}
	for _, p := range jsz.Meta.Replicas {
		if running[p.Name] && (!p.Current || p.Offline) {
			return fmt.Errorf("meta peer %s not current", p.Name)
		}
		delete(running, p.Name)
	}
	delete(running, leader.name)
	if len(running) > 0 {
		return fmt.Errorf("meta leader %s does not know %v yet", leader.name, slices.Sorted(maps.Keys(running)))
	}
	return nil
}

// accountInfo asks $JS.API.INFO through urls as user u, giving up after
// within.
func accountInfo(urls string, u natsauth.User, within time.Duration) error {
	within = max(within, 100*time.Millisecond)
	nc, err := nats.Connect(urls, append(natsauth.ConnectOptions(u.Name, u.Password), nats.Timeout(within))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(within, 2*time.Second))
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// Cut takes the region's leafnode links down, as a network partition would:
// its connections to the hub are closed and reconnects fail until Heal. Cut
// returns once both ends have dropped every link (or after 10 seconds). The
// region's own servers keep running. It panics on a region the topology
// does not have.
func (t *Topology) Cut(region string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.region(region)
	g.cut = true
	g.proxy.Cut()
	_ = t.waitLink(g, false) // both ends notice a closed socket at once
}

// Heal brings the region's leafnode links back after Cut and waits, at most
// 10 seconds, until every running server of the region has reconnected to
// the hub; LinkUp tells whether they did. Subscription interest crosses the
// new link a moment after it is up, so a publish right after Heal may still
// find no responders: retry it. It panics on a region the topology does not
// have.
func (t *Topology) Heal(region string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.region(region)
	g.cut = false
	g.proxy.Heal()
	_ = t.waitLink(g, true)
}

// RestartRegion shuts every server of the region down and starts them again
// on the same ports with the same store directories, so its JetStream
// streams and messages survive. Unless the region is cut, it then waits
// until the links to the hub are back, and it waits until the region's
// JetStream answers and, in a cluster, every stream has a leader and
// current copies (WaitStreamsCurrent). It returns an error when a server
// does not come back or, unless cut, the links do not come back within 10
// seconds, or JetStream and its streams are not back within 30 each.
func (t *Topology) RestartRegion(region string) error { return t.RestartRegionAfter(region, 0) }

// RestartRegionAfter is RestartRegion with the servers left down for down
// before they start again: an outage their clients notice.
func (t *Topology) RestartRegionAfter(region string, down time.Duration) error {
	return t.RestartRegionWhen(region, func() bool { return false }, down)
}

// RestartRegionWhen is RestartRegion with the servers left down until done
// reports true (asked every 20 ms) or longest has passed: an outage that
// lasts until what it is for has happened.
func (t *Topology) RestartRegionWhen(region string, done func() bool, longest time.Duration) error {
	if err := t.stopRegion(region); err != nil {
		return err
	}
	for end := time.Now().Add(longest); time.Now().Before(end) && !done(); {
		time.Sleep(20 * time.Millisecond)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.regions[region]
	for _, n := range g.nodes {
		if err := t.startNode(g, n); err != nil {
			return fmt.Errorf("natsembed: restart: %w", err)
		}
	}
	if !g.cut {
		if err := t.waitLink(g, true); err != nil {
			return fmt.Errorf("natsembed: restart: %w", err)
		}
	}
	if err := t.waitJetStream(g); err != nil {
		return fmt.Errorf("natsembed: restart: %w", err)
	}
	// A cluster restarted as a whole elects a leader for every stream
	// again, a few seconds in which its streams do not answer.
	if err := waitFor(jetStreamWait, func() bool { return streamsBehind(g) == nil }, func() error {
		return fmt.Errorf("natsembed: restart: region %s: streams not current after %s: %w", g.name, jetStreamWait, streamsBehind(g))
	}); err != nil {
		return err
	}
	return nil
}

// stopRegion shuts the region's servers down and waits until the hub
// dropped their links.
func (t *Topology) stopRegion(region string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, ok := t.regions[region]
	if !ok {
		return fmt.Errorf("natsembed: restart region %q: no such region", region)
	}
	for _, n := range g.nodes {
		stop(n)
	}
	// Let the hub drop the old connections before the new servers dial in.
	if err := t.waitLink(g, false); err != nil {
		return fmt.Errorf("natsembed: restart: %w", err)
	}
	return nil
}

// stop shuts n's server down, if it runs, without lame-duck mode: its
// connections close at once, as in-process allows for a crash.
func stop(n *node) {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// StopNode shuts down the region's node i (0-based) abruptly: no lame-duck
// mode, its clients and routes see their connections close. The rest of the
// region keeps running; in a cluster its streams keep a quorum of two. It
// returns once the hub has dropped the node's link, or an error for an
// unknown region or node, a node already stopped, or a link still seen after
// 10 seconds.
func (t *Topology) StopNode(region string, i int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, n, err := t.lookup(region, i)
	if err != nil {
		return err
	}
	if n.srv == nil {
		return fmt.Errorf("natsembed: stop node: %s is already stopped", n.name)
	}
	stop(n)
	if err := t.waitNodeLink(g, n, false); err != nil {
		return fmt.Errorf("natsembed: stop node: %w", err)
	}
	return nil
}

// StartNode starts the region's node i (0-based) again after StopNode, on
// the same ports with the same store directory (empty after WipeNode). It
// returns once the node accepts connections, its link to the hub is up
// (unless the region is cut) and the region's JetStream answers with the
// node among the meta leader's current peers; or an error for an unknown
// region or node, a node that runs, or a server, link or JetStream not back
// in time (10, 10 and 30 seconds).
func (t *Topology) StartNode(region string, i int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, n, err := t.lookup(region, i)
	if err != nil {
		return err
	}
	if n.srv != nil {
		return fmt.Errorf("natsembed: start node: %s is running", n.name)
	}
	if err := t.startNode(g, n); err != nil {
		return fmt.Errorf("natsembed: start node: %w", err)
	}
	if !g.cut {
		if err := t.waitNodeLink(g, n, true); err != nil {
			return fmt.Errorf("natsembed: start node: %w", err)
		}
	}
	if err := t.waitJetStream(g); err != nil {
		return fmt.Errorf("natsembed: start node: %w", err)
	}
	return nil
}

// WipeNode deletes the whole store directory of the region's node i
// (0-based), as a lost disk would: its streams, their messages and its
// JetStream cluster state. The node must be stopped; StartNode then brings
// it back empty, and the cluster copies the streams to it again
// (WaitStreamsCurrent). It returns an error for an unknown region or node,
// a running node, or a directory that cannot be removed.
func (t *Topology) WipeNode(region string, i int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, n, err := t.lookup(region, i)
	if err != nil {
		return err
	}
	if n.srv != nil {
		return fmt.Errorf("natsembed: wipe node: %s is running; stop it first", n.name)
	}
	if err := os.RemoveAll(n.storeDir); err != nil {
		return fmt.Errorf("natsembed: wipe node %s: %w", n.name, err)
	}
	return nil
}

// StreamLeader returns the index (0-based) of the region's node that leads
// the stream: the node whose server holds it, for a single server. It
// returns an error for an unknown region, or when no running node leads the
// stream (it does not exist, or its replicas are electing a leader: retry).
func (t *Topology) StreamLeader(region, stream string) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, _, err := t.lookup(region, 0)
	if err != nil {
		return 0, err
	}
	for i, n := range g.nodes {
		if !n.running() {
			continue
		}
		if len(g.nodes) == 1 {
			if _, err := streamDetail(n, stream); err != nil {
				return 0, fmt.Errorf("natsembed: stream leader: %w", err)
			}
			return 0, nil
		}
		if n.srv.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("natsembed: stream leader: no running node of %s leads stream %s", region, stream)
}

// streamDetail returns n's copy of the stream, or an error when n has
// none.
func streamDetail(n *node, stream string) (*server.StreamDetail, error) {
	streams, err := nodeStreams(n)
	if err != nil {
		return nil, err
	}
	for _, sd := range streams {
		if sd.Name == stream {
			return sd, nil
		}
	}
	return nil, fmt.Errorf("%s has no stream %s", n.name, stream)
}

// nodeStreams returns the streams n holds a copy of, in the global
// account.
func nodeStreams(n *node) ([]*server.StreamDetail, error) {
	jsz, err := n.srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Config: true})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	var out []*server.StreamDetail
	for _, a := range jsz.AccountDetails {
		if a.Name == server.DEFAULT_GLOBAL_ACCOUNT {
			for i := range a.Streams {
				out = append(out, &a.Streams[i])
			}
		}
	}
	return out, nil
}

// WaitStreamsCurrent waits until every running node of the region holds a
// current copy of every stream of the region: each stream has a leader,
// every running node has the stream, reports it current (not catching up),
// and has the leader's last sequence and message count. Stopped nodes are
// not waited for. It returns at once for a single server that runs, and
// ctx's error, naming the stream and node still behind, when ctx ends
// first; an error for an unknown region or a region with no running node.
func (t *Topology) WaitStreamsCurrent(ctx context.Context, region string) error {
	for {
		t.mu.Lock()
		g, ok := t.regions[region]
		var behind error
		if !ok {
			t.mu.Unlock()
			return fmt.Errorf("natsembed: wait streams current: no region %q (regions %v)", region, t.order)
		}
		behind = streamsBehind(g)
		t.mu.Unlock()
		if behind == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsembed: wait streams current in %s: %w (%w)", region, ctx.Err(), behind)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// streamsBehind returns nil when every running node of g has a current
// copy of every stream, or what is behind.
func streamsBehind(g *region) error {
	var running []*node
	for _, n := range g.nodes {
		if n.running() {
			running = append(running, n)
		}
	}
	if len(running) == 0 {
		return fmt.Errorf("no node of %s runs", g.name)
	}
	if len(g.nodes) == 1 {
		return nil
	}
	copies := map[string]map[string]*server.StreamDetail{} // stream, node
	for _, n := range running {
		streams, err := nodeStreams(n)
		if err != nil {
			return err
		}
		for _, sd := range streams {
			if copies[sd.Name] == nil {
				copies[sd.Name] = map[string]*server.StreamDetail{}
			}
			copies[sd.Name][n.name] = sd
		}
	}
	for _, stream := range slices.Sorted(maps.Keys(copies)) {
		var lead *server.StreamDetail
		for _, n := range running {
			if n.srv.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
				lead = copies[stream][n.name]
			}
		}
		if lead == nil {
			return fmt.Errorf("stream %s has no leader", stream)
		}
		replicas := 1
		if lead.Config != nil {
			replicas = lead.Config.Replicas
		}
		have := 0
		for _, n := range running {
			sd := copies[stream][n.name]
			if sd == nil {
				continue
			}
			have++
			if !n.srv.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
				return fmt.Errorf("stream %s on %s is not current", stream, n.name)
			}
			// The copies of a work-queue or interest stream remove acked
			// messages each at its own pace (through their consumers'
			// replicated state), so only their last sequences must agree.
			acked := lead.Config != nil && lead.Config.Retention != server.LimitsPolicy
			if sd.State.LastSeq != lead.State.LastSeq || (!acked && sd.State.Msgs != lead.State.Msgs) {
				return fmt.Errorf("stream %s on %s: last sequence %d, %d messages; the leader has %d, %d",
					stream, n.name, sd.State.LastSeq, sd.State.Msgs, lead.State.LastSeq, lead.State.Msgs)
			}
		}
		if want := min(replicas, len(running)); have < want {
			return fmt.Errorf("stream %s: %d running nodes have a copy, want %d", stream, have, want)
		}
	}
	return nil
}

// Shutdown stops every server and proxy of the topology and waits until the
// servers have stopped. It is safe to call more than once.
func (t *Topology) Shutdown() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.order {
		g := t.regions[r]
		for _, n := range g.nodes {
			stop(n)
		}
		if g.control != nil {
			g.control.Close()
		}
		g.proxy.Close()
	}
	if t.hub != nil {
		t.hub.Shutdown()
		t.hub.WaitForShutdown()
	}
}

// MustStartTopology starts a topology with the given regions, one server
// each, for a test, with store directories under tb.TempDir(), and shuts it
// down at cleanup.
func MustStartTopology(tb testing.TB, regions ...string) *Topology {
	tb.Helper()
	return MustStartTopologyWith(tb, TopologyOptions{Regions: regions})
}

// MustStartTopologyWith starts a topology from o for a test, with store
// directories under tb.TempDir() unless o.Dir is set, and shuts it down at
// cleanup.
func MustStartTopologyWith(tb testing.TB, o TopologyOptions) *Topology {
	tb.Helper()
	if o.Dir == "" {
		o.Dir = tb.TempDir()
	}
	t, err := StartTopology(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(t.Shutdown)
	return t
}
