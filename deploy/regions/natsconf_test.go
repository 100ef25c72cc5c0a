package regions_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/paymesh/paymesh/internal/platform/natsauth"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
)

// checkUsers compares the users a config gives a server with the
// definitions the embedded topology runs with, and prints the text that
// would make them agree.
func checkUsers(t *testing.T, what string, got []*server.User, want []natsauth.User) {
	t.Helper()
	if !reflect.DeepEqual(got, natsembed.ServerUsers(want)) {
		t.Errorf("%s differ from internal/platform/natsauth; want\n%s", what, natsauth.Conf(want, "  "))
	}
}

// natsConfDir holds the nats-server configs that docker-compose.yml mounts.
const natsConfDir = "nats"

// loadNATSConf parses a config with nats-server's own parser, so a config
// that the server would refuse fails here too.
func loadNATSConf(t *testing.T, name string) *server.Options {
	t.Helper()
	path := filepath.Join(natsConfDir, name+".conf")
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return o
}

// TestNATSConfigs checks deploy/regions/nats against the region table: the
// hub listens for leafnodes on 7422 without JetStream and without advertising
// its address, every region's server
// is named after the region, runs JetStream in the region's domain on the
// ports docker-compose publishes, and has exactly one leaf remote, the hub
// reached through the region's WAN link (compose service wan-<region>, which
// listens on the hub's leaf port);
// every server has the users and permissions of internal/platform/natsauth (the
// hub: a client user that may do nothing and one leafnode user per region,
// with which each region joins); and there is no config for a region the
// table does not know.
func TestNATSConfigs(t *testing.T) {
	tab := mustTable(t)

	hub := loadNATSConf(t, "hub")
	if hub.ServerName != "hub" || hub.JetStream || hub.LeafNode.Port != tab.Hub.LeafPort || len(hub.LeafNode.Remotes) != 0 {
		t.Errorf("hub.conf: server_name %q, jetstream %v, leafnode port %d, %d remotes; want hub, no JetStream, %d (regions.yaml's hub.leaf_port), none",
			hub.ServerName, hub.JetStream, hub.LeafNode.Port, len(hub.LeafNode.Remotes), tab.Hub.LeafPort)
	}
	if !hub.LeafNode.NoAdvertise {
		t.Error("hub.conf: leafnodes no_advertise is off; regions must reconnect through their WAN links, not to an advertised address")
	}

	for _, r := range tab.Regions {
		o := loadNATSConf(t, r.Name)
		if o.ServerName != r.Name {
			t.Errorf("%s.conf: server_name %q, want %q", r.Name, o.ServerName, r.Name)
		}
		if !o.JetStream || o.JetStreamDomain != r.Name || o.StoreDir != "/data" {
			t.Errorf("%s.conf: jetstream %v, domain %q, store_dir %q; want JetStream in domain %q on /data",
				r.Name, o.JetStream, o.JetStreamDomain, o.StoreDir, r.Name)
		}
		if o.Port != 4222 || o.HTTPPort != 8222 {
			t.Errorf("%s.conf: port %d, http %d; want 4222, 8222 (the ports docker-compose publishes)", r.Name, o.Port, o.HTTPPort)
		}
		if o.Cluster.Port != 0 || o.Gateway.Name != "" || o.LeafNode.Port != 0 {
			t.Errorf("%s.conf: a region joins only the hub, as a leafnode: cluster port %d, gateway %q, leafnode port %d",
				r.Name, o.Cluster.Port, o.Gateway.Name, o.LeafNode.Port)
		}
		var urls []string
		for _, rem := range o.LeafNode.Remotes {
			for _, u := range rem.URLs {
				urls = append(urls, u.String())
			}
		}
		leaf := natsauth.LeafUserName(r.Name)
		link := fmt.Sprintf("wan-%s:%d", r.Name, tab.Hub.LeafPort)
		wantURL := "nats-leaf://" + leaf + ":" + natsauth.DevPassword(leaf) + "@" + link
		if len(urls) != 1 || urls[0] != wantURL {
			t.Errorf("%s.conf: leaf remotes %v, want exactly nats-leaf://%s (the region's WAN link to the hub) as %s", r.Name, urls, link, leaf)
		}
		checkUsers(t, r.Name+".conf users", o.Users, natsauth.Users(r.Name))
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
