package compose_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/internal/lab/compose"
)

// goodMapper maps good.yml, with the hub's unpublished client port given.
func goodMapper(t *testing.T) *compose.Mapper {
	t.Helper()
	m, err := mustLoad(t, "good.yml", map[string]string{"SITE": "home"}).Mapper(map[string]string{"hub:4222": "127.0.0.1:4200"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMapperAddr(t *testing.T) {
	m := goodMapper(t)
	for in, want := range map[string]string{
		"db:5432": "127.0.0.1:5501",
		"postgres://postgres@db:5432/shop?sslmode=disable": "postgres://postgres@127.0.0.1:5501/shop?sslmode=disable",
		"postgres://u:p%40ss@db:5432":                      "postgres://u:p%40ss@127.0.0.1:5501",
		"nats://hub:4222":                                  "nats://127.0.0.1:4200",
		"http://app:9101/metrics?x=db:5432#f":              "http://127.0.0.1:9101/metrics?x=db:5432#f",
		"0.0.0.0:8101":                                     "127.0.0.1:8101",
		":9101":                                            "127.0.0.1:9101",
	} {
		got, err := m.Addr(in)
		if err != nil || got != want {
			t.Errorf("Addr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestMapperAddrErrors(t *testing.T) {
	m := goodMapper(t)
	for in, want := range map[string]string{
		"mars:80":          `host "mars" is not a service of project shop`,
		"http://mars:80/":  `host "mars" is not a service of project shop`,
		"127.0.0.1:5501":   `host "127.0.0.1" is not a service`,
		"hub:8222":         "service hub publishes no port 8222, and no extra mapping gives one",
		"db":               "want host:port",
		"http://app/x":     "want host:port",
		"db:http":          "want host:port",
		"nats://hub:99999": "want host:port",
	} {
		if got, err := m.Addr(in); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), in) {
			t.Errorf("Addr(%q) = %q, %v; want an error naming it with %q", in, got, err, want)
		}
	}
}

func TestMapperEnv(t *testing.T) {
	m := goodMapper(t)
	env := mustLoad(t, "good.yml", map[string]string{"SITE": "home"}).Services["app"].Environment
	got, err := m.Env(env)
	if err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(env)
	want["SHOP_DB"] = "postgres://postgres@127.0.0.1:5501/shop?sslmode=disable"
	want["SHOP_HUB"] = "nats://127.0.0.1:4200"
	want["SHOP_LISTEN"] = "127.0.0.1:8101"
	want["SHOP_PEERS"] = "a=http://127.0.0.1:8101,b=http://127.0.0.1:5501"
	if !maps.Equal(got, want) {
		t.Errorf("Env:\n got %v\nwant %v", got, want)
	}
	if env["SHOP_DB"] != "postgres://postgres@db:5432/shop?sslmode=disable" {
		t.Errorf("Env changed its argument: SHOP_DB %q", env["SHOP_DB"])
	}
	// A name that only starts like a service's, or a host that is not one,
	// is not an address of the project.
	same := map[string]string{"A": "dbx:5432", "B": "my-db:5432", "C": "mars:80", "D": "db.example:5432", "E": "apps:8101"}
	if got, err := m.Env(same); err != nil || !maps.Equal(got, same) {
		t.Errorf("Env(%v) = %v, %v; want it unchanged", same, got, err)
	}
	if _, err := m.Env(map[string]string{"MONITOR": "http://hub:8222/healthz"}); err == nil ||
		!strings.Contains(err.Error(), "MONITOR") || !strings.Contains(err.Error(), "service hub publishes no port 8222") {
		t.Errorf("Env with an unmapped port: %v, want an error naming MONITOR and the port", err)
	}
}

func TestMapperExtraErrors(t *testing.T) {
	p := mustLoad(t, "good.yml", map[string]string{"SITE": "home"})
	for from, to := range map[string]string{"mars:7422": "127.0.0.1:7422", "hub": "127.0.0.1:7422", "hub:7422": "127.0.0.1"} {
		if _, err := p.Mapper(map[string]string{from: to}); err == nil || !strings.Contains(err.Error(), from) {
			t.Errorf("Mapper(%s=%s): %v, want an error naming %s", from, to, err, from)
		}
	}
}

// TestMapperServiceEnv: a service's listen addresses go where its own
// ports are published or mapped.
func TestMapperServiceEnv(t *testing.T) {
	p := mustLoad(t, "good.yml", map[string]string{"SITE": "home"})
	m, err := p.Mapper(map[string]string{"app:8101": "127.0.0.1:18101", "hub:4222": "127.0.0.1:4200"})
	if err != nil {
		t.Fatal(err)
	}
	app := p.Services["app"]
	app.Environment["SHOP_METRICS"] = "0.0.0.0:9101"
	app.Environment["SHOP_DEBUG"] = "0.0.0.0:6060"
	got, err := m.ServiceEnv(app)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"SHOP_LISTEN":  "127.0.0.1:18101", // mapped
		"SHOP_METRICS": "127.0.0.1:9101",  // published
		"SHOP_DEBUG":   "127.0.0.1:6060",  // neither
		"SHOP_PEERS":   "a=http://127.0.0.1:18101,b=http://127.0.0.1:5501",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	app.Environment["SHOP_BAD"] = "http://hub:8222"
	if _, err := m.ServiceEnv(app); err == nil || !strings.Contains(err.Error(), "service app") || !strings.Contains(err.Error(), "SHOP_BAD") {
		t.Errorf("ServiceEnv with an unmapped port: %v, want an error naming the service and variable", err)
	}
}

func TestMapperText(t *testing.T) {
	m := goodMapper(t)
	conf := "port: 4222\nleafnodes { remotes = [ { url: \"nats-leaf://u:p@hub:4222\" } ] }\n# db:5432 and mars:80\n"
	want := "port: 4222\nleafnodes { remotes = [ { url: \"nats-leaf://u:p@127.0.0.1:4200\" } ] }\n# 127.0.0.1:5501 and mars:80\n"
	if got, err := m.Text(conf); err != nil || got != want {
		t.Errorf("Text:\n got %q, %v\nwant %q", got, err, want)
	}
	if _, err := m.Text("monitor hub:8222"); err == nil || !strings.Contains(err.Error(), "service hub publishes no port 8222") {
		t.Errorf("Text with an unmapped port: %v", err)
	}
}

// TestMapperTextURLList: a list of servers' URLs (a region's
// PAYMESH_NATS_URL, every node of its cluster) maps each URL, and one URL
// that cannot be mapped fails the whole value, naming its service and port.
func TestMapperTextURLList(t *testing.T) {
	m := goodMapper(t)
	got, err := m.Text("nats://hub:4222,nats://db:5432,nats://app:8101")
	if want := "nats://127.0.0.1:4200,nats://127.0.0.1:5501,nats://127.0.0.1:8101"; err != nil || got != want {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	if _, err := m.Text("nats://hub:4222,nats://hub:6222"); err == nil || !strings.Contains(err.Error(), "service hub publishes no port 6222") {
		t.Errorf("a list with an unmapped URL: got %v, want an error naming hub's port 6222", err)
	}
}
