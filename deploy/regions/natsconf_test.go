package regions_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
)

// checkUsers compares the users a config gives a server with the
// definitions the embedded topology runs with, and prints the text that
// would make them agree.
func checkUsers(t *testing.T, what string, got []*server.User, want []natsauth.User) {
	t.Helper()
	if !reflect.DeepEqual(got, natsembed.ServerUsers(want)) {
		t.Errorf("%s differ from platform/natsauth; want\n%s", what, natsauth.Conf(want, "  "))
	}
}

// natsConfDir holds the nats-server configs that docker-compose.yml mounts.
const natsConfDir = "nats"

// clusterPort is where a region's nodes listen for each other's routes.
const clusterPort = 6222

// loadNATSConf parses a config with nats-server's own parser, so a config
// that the server would refuse fails here too; its certificates are those
// of the PKI in dir (pki), which the parser loads.
func loadNATSConf(t *testing.T, name, dir string) *server.Options {
	t.Helper()
	path := filepath.Join(natsConfDir, name+".conf")
	o, err := server.ProcessConfigFile(withPKI(t, path, dir))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return o
}

// serverNameEnv is the environment variable from which every node of a
// region's cluster takes its server_name (docker-compose sets it to the
// node's service name).
const serverNameEnv = "NATS_SERVER_NAME"

// TestNATSConfigs checks deploy/regions/nats against the region table: the
// hub listens for leafnodes on 7422 without JetStream and without advertising
// its address; every node of a region's cluster (regions.yaml's nats.nodes)
// runs the region's one config, named after its node from the environment,
// with JetStream in the region's domain on the ports docker-compose
// publishes, a cluster named after the region that routes to every node of
// the table on 6222, and exactly one leaf remote, the hub reached through the
// region's WAN link (compose service wan-<region>, which listens on the hub's
// leaf port); every server has the users and permissions of
// platform/natsauth (the hub: a client user that may do nothing and
// one leafnode user per region, with which each region joins); and there is
// no config for a region the table does not know.
func TestNATSConfigs(t *testing.T) {
	tab := mustTable(t)
	dir := pki(t)

	hub := loadNATSConf(t, "hub", dir)
	if hub.ServerName != "hub" || hub.JetStream || hub.LeafNode.Port != tab.Hub.LeafPort || len(hub.LeafNode.Remotes) != 0 {
		t.Errorf("hub.conf: server_name %q, jetstream %v, leafnode port %d, %d remotes; want hub, no JetStream, %d (regions.yaml's hub.leaf_port), none",
			hub.ServerName, hub.JetStream, hub.LeafNode.Port, len(hub.LeafNode.Remotes), tab.Hub.LeafPort)
	}
	checkTLS(t, "hub.conf", hub, dir, "nats-hub")
	if hub.LeafNode.TLSConfig == nil || hub.LeafNode.TLSConfig.ClientAuth != tls.NoClientCert || hub.LeafNode.TLSTimeout < 2 {
		t.Errorf("hub.conf: leafnodes without TLS (%v), or with client certificates asked (leafnodes log in as users), or a TLS timeout under 2 s (%v)",
			hub.LeafNode.TLSConfig, hub.LeafNode.TLSTimeout)
	}
	if !hub.LeafNode.NoAdvertise {
		t.Error("hub.conf: leafnodes no_advertise is off; regions must reconnect through their WAN links, not to an advertised address")
	}

	for _, r := range tab.Regions {
		var wantRoutes []string
		for _, n := range r.NodeNames() {
			wantRoutes = append(wantRoutes, fmt.Sprintf("nats-route://%s:%d", n, clusterPort))
		}
		for _, node := range r.NodeNames() {
			t.Setenv(serverNameEnv, node)
			o := loadNATSConf(t, r.Name, dir)
			conf := r.Name + ".conf as " + node
			checkTLS(t, conf, o, dir, "nats-"+r.Name)
			if c := o.Cluster.TLSConfig; c == nil || c.ClientAuth != tls.RequireAndVerifyClientCert || c.RootCAs == nil || len(c.Certificates) != 1 {
				t.Errorf("%s: cluster routes without mutual TLS (%+v)", conf, c)
			}
			if o.ServerName != node {
				t.Errorf("%s: server_name %q, want %q (from %s)", conf, o.ServerName, node, serverNameEnv)
			}
			if !o.JetStream || o.JetStreamDomain != r.Name || o.StoreDir != "/data" {
				t.Errorf("%s: jetstream %v, domain %q, store_dir %q; want JetStream in domain %q on /data",
					conf, o.JetStream, o.JetStreamDomain, o.StoreDir, r.Name)
			}
			if o.Port != 4222 || o.HTTPPort != 8222 {
				t.Errorf("%s: port %d, http %d; want 4222, 8222 (the ports docker-compose publishes)", conf, o.Port, o.HTTPPort)
			}
			var routes []string
			for _, u := range o.Routes {
				routes = append(routes, u.String())
			}
			if o.Cluster.Name != r.Name || o.Cluster.Port != clusterPort || !slices.Equal(routes, wantRoutes) {
				t.Errorf("%s: cluster %q on port %d with routes %v; want %q on %d with routes %v (every node of regions.yaml)",
					conf, o.Cluster.Name, o.Cluster.Port, routes, r.Name, clusterPort, wantRoutes)
			}
			if o.Gateway.Name != "" || o.LeafNode.Port != 0 {
				t.Errorf("%s: a region joins the hub only as a leafnode: gateway %q, leafnode port %d", conf, o.Gateway.Name, o.LeafNode.Port)
			}
			var urls []string
			for _, rem := range o.LeafNode.Remotes {
				if rem.TLSConfig == nil || rem.TLSConfig.RootCAs == nil {
					t.Errorf("%s: leaf remote %v without TLS verified by the CA", conf, rem.URLs)
				}
				for _, u := range rem.URLs {
					urls = append(urls, u.String())
				}
			}
			leaf := natsauth.LeafUserName(r.Name)
			link := fmt.Sprintf("wan-%s:%d", r.Name, tab.Hub.LeafPort)
			wantURL := "nats-leaf://" + leaf + ":" + natsauth.DevPassword(leaf) + "@" + link
			if len(urls) != 1 || urls[0] != wantURL {
				t.Errorf("%s: leaf remotes %v, want exactly nats-leaf://%s (the region's WAN link to the hub) as %s", conf, urls, link, leaf)
			}
			checkUsers(t, conf+" users", o.Users, natsauth.Users(r.Name))
		}
	}
	checkUsers(t, "hub.conf users", hub.Users, natsauth.HubUsers())
	var names []string
	for _, r := range tab.Regions {
		names = append(names, r.Name)
	}
	checkUsers(t, "hub.conf leafnode users", hub.LeafNode.Users, natsauth.LeafUsers(names))

	entries, err := os.ReadDir(natsConfDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".conf")
		if !ok || name == "hub" {
			continue
		}
		if _, known := tab.Get(name); !known {
			t.Errorf("%s/%s: config for a region not in regions.yaml", natsConfDir, e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(natsConfDir, "mars.conf")); !os.IsNotExist(err) {
		t.Errorf("mars.conf: got %v, want no config for an unknown region", err)
	}
}

// TestNATSConfigNeedsNodeName: a region's config started without a node
// name in the environment is refused by nats-server's parser, naming the
// variable, rather than starting a node without its name.
func TestNATSConfigNeedsNodeName(t *testing.T) {
	tab := mustTable(t)
	r := tab.Regions[0]
	path := withPKI(t, filepath.Join(natsConfDir, r.Name+".conf"), pki(t))
	t.Setenv(serverNameEnv, "")
	os.Unsetenv(serverNameEnv)
	_, err := server.ProcessConfigFile(path)
	if err == nil || !strings.Contains(err.Error(), serverNameEnv) {
		t.Fatalf("%s without %s: got %v, want an error naming it", path, serverNameEnv, err)
	}
}

// checkTLS: a server's client port requires TLS with the certificate
// certs.Servers names for it (name.pem of the PKI in dir), and gives TLS
// handshakes at least 2 s (a loaded machine, a WAN link).
func checkTLS(t *testing.T, conf string, o *server.Options, dir, name string) {
	t.Helper()
	if o.TLSConfig == nil || len(o.TLSConfig.Certificates) != 1 || o.TLSTimeout < 2 {
		t.Errorf("%s: client port without TLS (%v, timeout %v)", conf, o.TLSConfig, o.TLSTimeout)
		return
	}
	b, err := os.ReadFile(filepath.Join(dir, name+".pem"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	want, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.TLSConfig.Certificates[0].Certificate[0]; string(got) != string(want.Raw) {
		t.Errorf("%s: client port's certificate is not %s.pem", conf, name)
	}
}
