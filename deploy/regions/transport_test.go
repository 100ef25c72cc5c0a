package regions_test

import (
	"bufio"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/certs"
	"github.com/paymesh/paymesh/internal/lab/compose"
)

// certsService is the one-shot service that makes the development PKI
// (paymesh-lab certs) into the certs volume before any server starts.
const certsService = "certs"

// The PKI's volumes and where services mount them.
const (
	certsVolume = "certs"
	caVolume    = "ca"
	certsDir    = "/certs"
	caCert      = certsDir + "/" + certs.CAFile
	hbaTarget   = "/etc/postgresql/pg_hba.conf"
	hbaFile     = "deploy/postgres/pg_hba.conf"
)

// postgresPassword is the development password of a region's Postgres
// in docker-compose.yml.
func postgresPassword(r regions.Region) string {
	return "dev-only-postgres-" + r.Name + "-not-a-secret"
}

// mountsCerts reports whether a service mounts the certs volume
// read-only on /certs.
func mountsCerts(s compose.Service) bool {
	v, ok := s.Mount(certsDir)
	return ok && v.Type == "volume" && v.Source == certsVolume && v.ReadOnly
}

// TestComposeTransport: every link of docker-compose.yml is encrypted and
// authenticated. The certs service (the lab image's paymesh-lab certs)
// writes the PKI into the certs volume and the CA's key into the ca
// volume, which nothing else mounts; every nats-server and Postgres waits
// for it to complete and mounts the certs read-only; every Postgres runs
// with ssl=on, its own certificate and the hba file of deploy/postgres,
// with a password and no trust; every Postgres URL of every service
// verifies the server (sslmode=verify-full with the CA) and gives a
// password; every PAYMESH_NATS_URL is tls:// with PAYMESH_NATS_CA, and
// each such service mounts the CA it names.
func TestComposeTransport(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	c := service(t, p, certsService)
	if !c.Build || c.Target != "lab" || !slices.Equal(c.Command, []string{"certs", "--dir", certsDir, "--ca-dir", "/ca"}) {
		t.Errorf("%s: build %v target %q command %q, want the lab image running certs --dir %s --ca-dir /ca", certsService, c.Build, c.Target, c.Command, certsDir)
	}
	if v, ok := c.Mount(certsDir); !ok || v.Source != certsVolume || v.ReadOnly {
		t.Errorf("%s: %s is %+v, want the %s volume, writable", certsService, certsDir, v, certsVolume)
	}
	if v, ok := c.Mount("/ca"); !ok || v.Source != caVolume || v.ReadOnly {
		t.Errorf("%s: /ca is %+v, want the %s volume, writable", certsService, v, caVolume)
	}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		for _, v := range s.Volumes {
			if name != certsService && v.Type == "volume" && v.Source == caVolume {
				t.Errorf("%s: mounts the %s volume (the CA's key), which only %s may", name, caVolume, certsService)
			}
		}
		if isInfra(s) {
			if !mountsCerts(s) {
				t.Errorf("%s: volumes %+v, want %s:%s:ro", name, s.Volumes, certsVolume, certsDir)
			}
			if s.DependsOn[certsService] != compose.ServiceCompletedSuccessfully {
				t.Errorf("%s: depends on %s with condition %q, want %s (its certificate must exist)", name, certsService, s.DependsOn[certsService], compose.ServiceCompletedSuccessfully)
			}
		}
		for k, v := range s.Environment {
			for _, u := range postgresURLs(v) {
				checkPostgresURL(t, name+": "+k, u)
				if !mountsCerts(s) {
					t.Errorf("%s: %s names %s, but the service does not mount %s", name, k, caCert, certsDir)
				}
			}
		}
		if urls, ok := s.Environment["PAYMESH_NATS_URL"]; ok {
			for _, u := range strings.Split(urls, ",") {
				if !strings.HasPrefix(u, "tls://") {
					t.Errorf("%s: PAYMESH_NATS_URL has %q, want tls://", name, u)
				}
			}
			if s.Environment["PAYMESH_NATS_CA"] != caCert || !mountsCerts(s) {
				t.Errorf("%s: PAYMESH_NATS_CA %q (mounts %s: %v), want %s from the certs volume", name, s.Environment["PAYMESH_NATS_CA"], certsDir, mountsCerts(s), caCert)
			}
		}
	}
	for _, r := range tab.Regions {
		name := "postgres-" + r.Name
		pg := service(t, p, name)
		want := []string{"postgres", "-c", "ssl=on", "-c", "ssl_cert_file=" + certsDir + "/postgres-" + r.Name + ".pem",
			"-c", "ssl_key_file=" + certsDir + "/postgres-" + r.Name + "-key.pem", "-c", "hba_file=" + hbaTarget}
		if !slices.Equal(pg.Command, want) {
			t.Errorf("%s: command %q, want %q", name, pg.Command, want)
		}
		if got, ro := mountedFile(t, p, name, hbaTarget); got != hbaFile || !ro {
			t.Errorf("%s: mounts %s (read-only %v) at %s, want %s read-only", name, got, ro, hbaTarget, hbaFile)
		}
		if pg.Environment["POSTGRES_PASSWORD"] != postgresPassword(r) || pg.Environment["POSTGRES_HOST_AUTH_METHOD"] != "" {
			t.Errorf("%s: POSTGRES_PASSWORD %q, POSTGRES_HOST_AUTH_METHOD %q; want %q and none (no trust)", name,
				pg.Environment["POSTGRES_PASSWORD"], pg.Environment["POSTGRES_HOST_AUTH_METHOD"], postgresPassword(r))
		}
	}
	checkHBA(t, filepath.Join(repoRoot, hbaFile))
}

// postgresURLs returns the Postgres URLs in a variable's value: the value
// itself, or each region=URL of a list.
func postgresURLs(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if i := strings.Index(item, "postgres://"); i >= 0 {
			out = append(out, item[i:])
		}
	}
	return out
}

// checkPostgresURL: a URL verifies the server's certificate with the CA of
// the certs volume and gives a password.
func checkPostgresURL(t *testing.T, what, raw string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("%s: %q: %v", what, raw, err)
		return
	}
	q := u.Query()
	if _, hasPW := u.User.Password(); q.Get("sslmode") != "verify-full" || q.Get("sslrootcert") != caCert || !hasPW {
		t.Errorf("%s: %s: sslmode %q sslrootcert %q password %v; want verify-full, %s, a password", what, u.Redacted(), q.Get("sslmode"), q.Get("sslrootcert"), hasPW, caCert)
	}
}

// checkHBA: every rule of the hba file is a hostssl line with
// scram-sha-256, or the socket's peer line: no plain host line, no trust,
// md5 or password.
func checkHBA(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		rules++
		typ, method := fields[0], fields[len(fields)-1]
		if !(typ == "hostssl" && method == "scram-sha-256" && len(fields) == 5) && !(typ == "local" && method == "peer" && len(fields) == 4) {
			t.Errorf("%s:%d: %q: want hostssl ... scram-sha-256, or local ... peer", path, n, strings.TrimSpace(line))
		}
	}
	if rules == 0 {
		t.Errorf("%s: no rule", path)
	}
}

// pki writes the development PKI for the region table into a temporary
// folder and returns it: the certificates the nats configs name under
// /certs.
func pki(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := certs.Make(certs.Options{Dir: dir}, certs.Servers(mustTable(t))); err != nil {
		t.Fatal(err)
	}
	return dir
}

// withPKI returns a copy of a nats config, in a temporary folder, whose
// /certs paths name the files of dir.
func withPKI(t *testing.T, path, dir string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	text := strings.ReplaceAll(string(b), `"`+certsDir+`/`, `"`+dir+`/`)
	if err := os.WriteFile(out, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
