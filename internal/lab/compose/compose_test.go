package compose_test

import (
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/internal/lab/compose"
)

// mustLoad loads a file of testdata with the given environment.
func mustLoad(t *testing.T, name string, env map[string]string, profiles ...string) *compose.Project {
	t.Helper()
	p, err := compose.LoadEnv(filepath.Join("testdata", name), env, profiles...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	p := mustLoad(t, "good.yml", map[string]string{"SITE": "home", "SHOP_FROM_ENV": "given"})
	dir, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "shop" || p.Dir != dir {
		t.Errorf("project %q in %s, want shop in %s", p.Name, p.Dir, dir)
	}
	if got, want := p.ServiceNames(), []string{"app", "db", "hub"}; !slices.Equal(got, want) {
		t.Errorf("services %v, want %v (tool is in profile tools only)", got, want)
	}
	want := map[string]compose.Service{
		"hub": {
			Name: "hub", Image: "nats:2.15.2-alpine",
			Command:     []string{"-c", "/etc/nats/hub.conf"},
			Environment: map[string]string{}, DependsOn: map[string]string{},
			Healthcheck: []string{"CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8222/healthz"},
			Volumes:     []compose.Volume{{Type: "bind", Source: filepath.Join(dir, "hub.conf"), Target: "/etc/nats/hub.conf", ReadOnly: true}},
		},
		"db": {
			Name: "db", Image: "postgres:15",
			Environment: map[string]string{"POSTGRES_DB": "shop", "POSTGRES_HOST_AUTH_METHOD": "trust"},
			Ports:       []compose.Port{{Host: 5501, Container: 5432, Protocol: "tcp"}},
			DependsOn:   map[string]string{},
			Healthcheck: []string{"CMD-SHELL", "pg_isready -h 127.0.0.1"},
			Volumes:     []compose.Volume{{Type: "volume", Source: "dbdata", Target: "/var/lib/postgresql/data"}},
		},
		"app": {
			Name: "app", Build: true, Context: dir, Command: []string{"serve", "--verbose"}, // build: . from the file's folder
			Environment: map[string]string{
				"SHOP_DB":       "postgres://postgres@db:5432/shop?sslmode=disable",
				"SHOP_HUB":      "nats://hub:4222",
				"SHOP_LISTEN":   "0.0.0.0:8101",
				"SHOP_PEERS":    "a=http://app:8101,b=http://db:5432",
				"SHOP_NAME":     "shop at home",
				"SHOP_FROM_ENV": "given",
				"SHOP_PLAIN":    "nothing to map",
			},
			Ports:     []compose.Port{{Host: 8101, Container: 8101, Protocol: "tcp"}, {Host: 9101, Container: 9101, Protocol: "tcp"}},
			DependsOn: map[string]string{"db": compose.ServiceHealthy, "hub": compose.ServiceHealthy},
			Restart:   "unless-stopped", // from the file's x- anchor
		},
	}
	for name, w := range want {
		if got := p.Services[name]; !reflect.DeepEqual(got, w) {
			t.Errorf("service %s:\n got %+v\nwant %+v", name, got, w)
		}
	}
	if port, ok := p.Services["db"].Published(5432); !ok || port != 5501 {
		t.Errorf("db: Published(5432) = %d, %v; want 5501", port, ok)
	}
	if v, ok := p.Services["hub"].Mount("/etc/nats/hub.conf"); !ok || !v.ReadOnly {
		t.Errorf("hub: Mount(/etc/nats/hub.conf) = %+v, %v", v, ok)
	}
	if _, err := p.Service("mars"); err == nil || !strings.Contains(err.Error(), `no service "mars"`) {
		t.Errorf("Service(mars): %v, want no service error", err)
	}
}

func TestLoadProfiles(t *testing.T) {
	for _, tc := range []struct {
		profiles []string
		tool     bool
	}{{nil, false}, {[]string{"load"}, false}, {[]string{"tools"}, true}, {[]string{compose.AllProfiles}, true}} {
		p := mustLoad(t, "good.yml", map[string]string{"SITE": "home"}, tc.profiles...)
		tool, ok := p.Services["tool"]
		if ok != tc.tool {
			t.Errorf("profiles %v: tool enabled %v, want %v", tc.profiles, ok, tc.tool)
			continue
		}
		if ok && (!slices.Equal(tool.Command, []string{"verify", "--all"}) || tool.DependsOn["db"] != compose.ServiceStarted || !slices.Equal(tool.Profiles, []string{"tools"}) || tool.Restart != "no") {
			t.Errorf("tool: %+v", tool)
		}
	}
}

// TestLoadEnvironmentIsGivenOnly: the caller's environment neither
// interpolates nor fills variables listed without a value.
func TestLoadEnvironmentIsGivenOnly(t *testing.T) {
	t.Setenv("SITE", "leaked")
	t.Setenv("SHOP_FROM_ENV", "leaked")
	t.Setenv("PG_MAJOR", "99")
	p := mustLoad(t, "good.yml", map[string]string{"PG_MAJOR": "16"})
	env := p.Services["app"].Environment
	if env["SHOP_NAME"] != "shop at " {
		t.Errorf("SHOP_NAME %q, want the variable empty", env["SHOP_NAME"])
	}
	if v, ok := env["SHOP_FROM_ENV"]; ok {
		t.Errorf("SHOP_FROM_ENV = %q, want it left out", v)
	}
	if img := p.Services["db"].Image; img != "postgres:16" {
		t.Errorf("db image %q, want postgres:16 from the given environment", img)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"invalid-yaml.yml", "yaml: line "},
		{"unknown-dependency.yml", `service "app" depends on undefined service "db"`},
		{"port-clash.yml", "host port 8101/tcp is published by both a and b"},
		{"missing.yml", "no such file or directory"},
	} {
		t.Run(strings.TrimSuffix(tc.file, ".yml"), func(t *testing.T) {
			_, err := compose.Load(filepath.Join("testdata", tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.file) {
				t.Fatalf("got %v, want an error naming %s with %q", err, tc.file, tc.want)
			}
		})
	}
}

// TestLoadRepositoryFile: the repository's docker-compose.yml loads with
// every profile, and from its own directory.
func TestLoadRepositoryFile(t *testing.T) {
	p, err := compose.Load("../../../docker-compose.yml", compose.AllProfiles)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "paymesh" || p.Dir != root {
		t.Errorf("project %q in %s, want paymesh in %s", p.Name, p.Dir, root)
	}
	for _, name := range []string{"nats-hub", "ledger-eu", "loadgen", "verify-ap"} {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("no service %s among %v", name, slices.Sorted(maps.Keys(p.Services)))
		}
	}
	// Build contexts resolve from the file's folder: the repository's
	// root for the paymesh image, deploy/postgres for a region's database.
	for name, want := range map[string]string{"ledger-eu": root, "postgres-eu-1": filepath.Join(root, "deploy", "postgres")} {
		if s := p.Services[name]; !s.Build || s.Context != want {
			t.Errorf("%s: build %v context %q, want %s", name, s.Build, s.Context, want)
		}
	}
}
