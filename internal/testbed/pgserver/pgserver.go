package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Throwaway is a PostgreSQL cluster made from the local binaries in a
// temporary folder, for a demo on a machine without a server.
type Throwaway struct {
	// URL is the admin URL of the cluster.
	URL string
	// Dir holds the cluster; Stop removes it.
	Dir    string
	bin    string
	asUser string
	// uid and gid own the files the server reads (-1: this process's).
	uid, gid int
	opts     string // the server options, kept for Restart
}

// findBin finds the folder of initdb and pg_ctl: on PATH, or the newest
// /usr/lib/postgresql/<version>/bin.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb and pg_ctl on PATH or under /usr/lib/postgresql/*/bin; install PostgreSQL (apt-get install postgresql) or set PAYMESH_POSTGRES_URL to a server where the demo may create databases")
}

// StartThrowaway creates and starts a cluster on a free loopback port, with
// trust authentication for user postgres. When this process runs as root
// (initdb refuses to), the cluster runs as the system user postgres. It
// returns an error that says what to install when it cannot.
func StartThrowaway(ctx context.Context) (*Throwaway, error) {
	return StartThrowawayWith(ctx, ThrowawayOptions{})
}

// ThrowawayOptions sets up a throwaway cluster.
type ThrowawayOptions struct {
	// Port is the loopback port to listen on (0: a free one).
	Port int
	// Password, when set, is user postgres's password, stored as a
	// scram-sha-256 verifier; TCP connections must give it, and the
	// socket takes the server's own OS user only (peer). Empty: trust.
	Password string
	// CertFile and KeyFile, when set, turn TLS on (ssl=on) with that
	// certificate and key. Both are copied into the cluster's folder, the
	// key owned by the server's user with mode 0600, as Postgres requires.
	CertFile, KeyFile string
	// CAFile is the authority that signed CertFile: URL then verifies the
	// server with it (sslmode=verify-full); without it, URL requires TLS
	// without verifying (sslmode=require).
	CAFile string
	// HBAFile, when set, replaces the cluster's pg_hba.conf (copied in).
	HBAFile string
	// Settings are more server settings, each "name=value" (-c).
	Settings []string
}

// StartThrowawayWith is StartThrowaway with options. It returns an error
// naming the port when a fixed Port is taken or out of range.
func StartThrowawayWith(ctx context.Context, o ThrowawayOptions) (*Throwaway, error) {
	if o.Port < 0 || o.Port > 65535 {
		return nil, fmt.Errorf("throwaway postgres: port %d out of range", o.Port)
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, fmt.Errorf("throwaway postgres: a certificate (%q) and a key (%q): want both or neither", o.CertFile, o.KeyFile)
	}
	if o.CAFile != "" && o.CertFile == "" {
		return nil, errors.New("throwaway postgres: an authority without a certificate: TLS needs CertFile and KeyFile")
	}
	for _, kv := range o.Settings {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("throwaway postgres: setting %q: want name=value", kv)
		}
	}
	if o.Port != 0 {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", o.Port))
		if err != nil {
			return nil, fmt.Errorf("throwaway postgres: port %d is taken: %w", o.Port, err)
		}
		ln.Close()
	}
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	t := &Throwaway{bin: bin}
	dir, err := os.MkdirTemp("", "paymesh-pg-")
	if err != nil {
		return nil, err
	}
	t.Dir = dir
	t.uid, t.gid = -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, errors.New("running as root, and initdb refuses root: create a system user postgres or run as another user")
		}
		t.uid, _ = strconv.Atoi(u.Uid)
		t.gid, _ = strconv.Atoi(u.Gid)
		if err := os.Chown(dir, t.uid, t.gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		t.asUser = "postgres"
	}
	if err := t.initAndStart(ctx, o); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return t, nil
}

// initAndStart makes the cluster in t.Dir/data with o's authentication
// and TLS, starts it on o.Port (or a free port), and sets t.URL.
func (t *Throwaway) initAndStart(ctx context.Context, o ThrowawayOptions) error {
	data := filepath.Join(t.Dir, "data")
	initArgs := []string{"-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"}
	if o.Password != "" {
		pw := filepath.Join(t.Dir, "pwfile")
		if err := t.writeOwned(pw, []byte(o.Password+"\n"), 0o600); err != nil {
			return err
		}
		defer os.Remove(pw)
		initArgs = []string{"-D", data, "-U", "postgres", "--pwfile", pw, "--auth-local=peer", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"}
	}
	if out, err := t.run(ctx, "initdb", initArgs...); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, out)
	}
	settings := []string{"listen_addresses=127.0.0.1", "fsync=on"}
	if o.Password != "" {
		settings = append(settings, "password_encryption=scram-sha-256")
	}
	copies := []struct{ from, name, setting string }{
		{o.CertFile, "server.pem", "ssl_cert_file"},
		{o.KeyFile, "server-key.pem", "ssl_key_file"},
		{o.HBAFile, "pg_hba.conf", "hba_file"},
	}
	for _, c := range copies {
		if c.from == "" {
			continue
		}
		b, err := os.ReadFile(c.from)
		if err != nil {
			return fmt.Errorf("throwaway postgres: %s: %w", c.setting, err)
		}
		to := filepath.Join(t.Dir, c.name)
		if err := t.writeOwned(to, b, 0o600); err != nil {
			return err
		}
		settings = append(settings, c.setting+"="+to)
	}
	if o.CertFile != "" {
		settings = append(settings, "ssl=on")
	}
	settings = append(settings, o.Settings...)
	port, err := t.start(ctx, o.Port, settings)
	if err != nil {
		return err
	}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: fmt.Sprintf("127.0.0.1:%d", port), Path: "/postgres"}
	if o.Password != "" {
		u.User = url.UserPassword("postgres", o.Password)
	}
	q := url.Values{"sslmode": {"disable"}}
	switch {
	case o.CAFile != "":
		q = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {o.CAFile}}
	case o.CertFile != "":
		q = url.Values{"sslmode": {"require"}}
	}
	u.RawQuery = q.Encode()
	t.URL = u.String()
	return nil
}

// start starts the cluster in t.Dir/data on port, or on a free port when
// port is 0, and returns the port. A free port can be taken between the
// probe and the server's bind (a client's connection gets it as its own
// port on a busy machine): the server then fails with "Address already in
// use", and start tries another port, up to five.
func (t *Throwaway) start(ctx context.Context, port int, settings []string) (int, error) {
	for attempt := 1; ; attempt++ {
		p := port
		if p == 0 {
			var err error
			if p, err = freePort(); err != nil {
				return 0, err
			}
		}
		t.opts = fmt.Sprintf("-p %d -k %s", p, t.Dir)
		for _, kv := range settings {
			t.opts += " -c " + kv
		}
		logFile := filepath.Join(t.Dir, "log")
		out, err := t.run(ctx, "pg_ctl", "-D", filepath.Join(t.Dir, "data"), "-o", t.opts, "-l", logFile, "-w", "-t", "60", "start")
		if err == nil {
			return p, nil
		}
		log, _ := os.ReadFile(logFile)
		if port != 0 || attempt == 5 || !bytes.Contains(log, []byte("Address already in use")) {
			return 0, fmt.Errorf("pg_ctl start: %v: %s%s", err, out, log)
		}
		_ = os.Remove(logFile)
	}
}

// writeOwned writes a file in the cluster's folder that the server's user
// owns (its own when this process is not root).
func (t *Throwaway) writeOwned(path string, b []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("throwaway postgres: %w", err)
	}
	if t.uid >= 0 {
		if err := os.Chown(path, t.uid, t.gid); err != nil {
			return fmt.Errorf("throwaway postgres: %w", err)
		}
	}
	return nil
}

// Restart restarts the cluster in immediate mode (pg_ctl restart -m
// immediate): every server process is killed without a checkpoint, as in
// a crash, and the server starts again on the same port and data folder,
// running crash recovery before it accepts connections. Clients' open
// connections break; new ones succeed once Restart returns.
func (t *Throwaway) Restart(ctx context.Context) error {
	if out, err := t.run(ctx, "pg_ctl", "-D", filepath.Join(t.Dir, "data"), "-o", t.opts, "-l", filepath.Join(t.Dir, "log"),
		"-m", "immediate", "-w", "-t", "60", "restart"); err != nil {
		return fmt.Errorf("pg_ctl restart: %v: %s", err, out)
	}
	return nil
}

// BinDir returns the folder of the local PostgreSQL binaries (initdb,
// pg_ctl, postgres), or an error that says what to install.
func BinDir() (string, error) { return findBin() }

// Available reports whether StartThrowaway can find initdb and pg_ctl,
// with an error that says what to install when it cannot.
func Available() error {
	_, err := findBin()
	return err
}

// Stop stops the cluster and removes its folder.
func (t *Throwaway) Stop() error {
	_, err := t.run(context.Background(), "pg_ctl", "-D", filepath.Join(t.Dir, "data"), "-m", "fast", "-w", "stop")
	return errors.Join(err, os.RemoveAll(t.Dir))
}

func (t *Throwaway) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	path := filepath.Join(t.bin, prog)
	var cmd *exec.Cmd
	if t.asUser != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", t.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = t.Dir
	return cmd.CombinedOutput()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
