package regions_test

import (
	"bufio"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
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
// volume, which nothing else mounts; every nats-server and Postgres server
// waits for it to complete and mounts the certs read-only; every server of
// a region's Postgres formation (its monitor and data nodes) runs with the
// CA, the region's certificate and key of the certs volume (which name
// the server's host), the hba file of deploy/postgres mounted read-only,
// and the region's password, no trust; the entrypoint makes every server
// with TLS verified in full and the hba file instead of pg_autoctl's own
// rules; every Postgres URL of every service (the keepers' of their
// monitor included) verifies the server (sslmode=verify-full with the CA)
// and gives a password; every PAYMESH_NATS_URL is tls:// with
// PAYMESH_NATS_CA, and each such service mounts the CA it names.
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
				checkPostgresURL(t, name+": "+k, u.URL)
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
	pki := map[string]certs.Server{}
	for _, c := range certs.Servers(tab) {
		pki[c.Name] = c
	}
	for _, r := range tab.Regions {
		// One certificate for the region's formation, under the file
		// names of the certs service.
		cert, ok := pki["postgres-"+r.Name]
		if !ok {
			t.Errorf("region %s: no certificate postgres-%s among the certs service's", r.Name, r.Name)
			continue
		}
		for _, name := range postgresServers(r) {
			pg := service(t, p, name)
			env := pg.Environment
			want := map[string]string{
				"PGAF_CA_FILE":      caCert,
				"PGAF_CERT_FILE":    certsDir + "/postgres-" + r.Name + ".pem",
				"PGAF_KEY_FILE":     certsDir + "/postgres-" + r.Name + "-key.pem",
				"PGAF_HBA_FILE":     hbaTarget,
				"POSTGRES_PASSWORD": postgresPassword(r),
			}
			for k, v := range want {
				if env[k] != v {
					t.Errorf("%s: %s %q, want %q", name, k, env[k], v)
				}
			}
			if env["PGAF_CERT_FILE"] != certsDir+"/"+cert.CertFile() || env["PGAF_KEY_FILE"] != certsDir+"/"+cert.KeyFile() {
				t.Errorf("%s: certificate %s and key %s, but the certs service writes %s and %s", name, env["PGAF_CERT_FILE"], env["PGAF_KEY_FILE"], cert.CertFile(), cert.KeyFile())
			}
			if !slices.Contains(cert.Hosts, env["PGAF_HOSTNAME"]) {
				t.Errorf("%s: reached as %q, which its certificate %s does not name (%v): verify-full would fail", name, env["PGAF_HOSTNAME"], cert.Name, cert.Hosts)
			}
			if got, ro := mountedFile(t, p, name, hbaTarget); got != hbaFile || !ro {
				t.Errorf("%s: mounts %s (read-only %v) at %s, want %s read-only", name, got, ro, hbaTarget, hbaFile)
			}
			if _, ok := env["POSTGRES_HOST_AUTH_METHOD"]; ok {
				t.Errorf("%s: POSTGRES_HOST_AUTH_METHOD %q; want none (no trust)", name, env["POSTGRES_HOST_AUTH_METHOD"])
			}
		}
	}
	checkFormationSecured(t)
	checkHBA(t, filepath.Join(repoRoot, hbaFile))
}

// checkFormationSecured: the entrypoint makes every server (the monitor
// and the data nodes alike) with TLS verified in full, with the
// certificate, key and CA it is given, and without pg_autoctl's own hba
// rules, and puts the given hba file in place of the server's at every
// start.
func checkFormationSecured(t *testing.T) {
	t.Helper()
	text := strings.ReplaceAll(readFormation(t).text, "\\\n", " ") // continued lines joined
	tls := regexp.MustCompile(`(?m)^tls="([^"]*)"$`).FindStringSubmatch(text)
	if tls == nil {
		t.Fatalf("%s: no tls=\"...\" options for pg_autoctl create", formationFile)
	}
	for _, opt := range []string{"--skip-pg-hba", "--ssl-mode verify-full", "--ssl-ca-file ", "--server-cert ", "--server-key "} {
		if !strings.Contains(tls[1], opt) {
			t.Errorf("%s: pg_autoctl create's options %q lack %s", formationFile, tls[1], opt)
		}
	}
	for _, role := range []string{"monitor", "postgres"} {
		if !regexp.MustCompile(`pg_autoctl create ` + role + ` [^\n]*\$tls\b`).MatchString(text) {
			t.Errorf("%s: pg_autoctl create %s without $tls", formationFile, role)
		}
	}
	if !strings.Contains(text, `cp "$PGAF_HBA_FILE" "$PGDATA/pg_hba.conf"`) {
		t.Errorf("%s: does not put PGAF_HBA_FILE in place of the server's hba file", formationFile)
	}
}

// regionURL is one Postgres URL of a variable's value, with the region
// that a list gives it ("" for none).
type regionURL struct{ Region, URL string }

// pgListItem finds where a Postgres URL starts in a value: at its start or
// after a comma, with an optional region= before it. A comma between the
// hosts of a multi-host URL starts no item: no scheme follows it.
var pgListItem = regexp.MustCompile(`(?:^|,)(?:([a-z]{2,8})=)?(postgres(?:ql)?://)`)

// postgresURLs returns the Postgres URLs in a variable's value: the value
// itself, or each region=URL of a comma-separated list, each URL whole
// with every host of a multi-host URL.
func postgresURLs(v string) []regionURL {
	var out []regionURL
	m := pgListItem.FindAllStringSubmatchIndex(v, -1)
	for i, loc := range m {
		end := len(v)
		if i+1 < len(m) {
			end = m[i+1][0]
		}
		item := regionURL{URL: v[loc[4]:end]}
		if loc[2] >= 0 {
			item.Region = v[loc[2]:loc[3]]
		}
		out = append(out, item)
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
		// The one peer rule with a map: the monitor's OS user as
		// autoctl_node, on the monitor's database only.
		mapped := slices.Equal(fields, []string{"local", "pg_auto_failover", "autoctl_node", "peer", "map=pgautofailover"})
		if !(typ == "hostssl" && method == "scram-sha-256" && len(fields) == 5) && !(typ == "local" && method == "peer" && len(fields) == 4) && !mapped {
			t.Errorf("%s:%d: %q: want hostssl ... scram-sha-256, local ... peer, or the monitor's mapped peer rule", path, n, strings.TrimSpace(line))
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
