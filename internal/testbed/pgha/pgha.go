// Package pgha runs a highly available PostgreSQL formation on this
// machine, for the fault suite and the tests: pg_auto_failover's monitor
// and one keeper (pg_autoctl) per data node, each node's server on a data
// folder of its own, a primary and synchronous standbys. The monitor
// elects and promotes; pgha only starts the processes, kills them as a
// crash would, and reads the monitor's view. The engine comes from
// Debian's packages (scripts/pgautofailover).
package pgha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/testbed/pgserver"
)

// Timing is the monitor's failover timers (its pgautofailover.* settings).
type Timing struct {
	// HealthCheck is how often the monitor probes each node.
	HealthCheck time.Duration
	// Unhealthy is how long a node may fail its probes and keeper reports
	// before the monitor acts on it.
	Unhealthy time.Duration
	// Demote is how long the monitor waits for a failed primary to say it
	// stepped down before the standby takes writes.
	Demote time.Duration
}

// FastTiming replaces a dead primary in about 5 s, for runs of a few
// minutes (pg_auto_failover's own timers take about 50 s: 20 s to judge a
// node unhealthy, 30 s of demote timeout). It stays safe with synchronous replication: a primary cut off
// from its standby commits nothing, however long it takes to step down.
var FastTiming = Timing{HealthCheck: time.Second, Unhealthy: 3 * time.Second, Demote: 2 * time.Second}

// Options sets up a formation.
type Options struct {
	// Nodes is the number of data nodes (0: 2, a primary and its
	// synchronous standby).
	Nodes int
	// Timing is the monitor's failover timers (zero: FastTiming).
	Timing Timing
	// Secure, when set, runs the formation as a deployment would (nil:
	// trust, no TLS).
	Secure *Secure
}

// Secure is a formation's transport security: TLS on every server, with
// verify-full on every connection between them and from clients, and a
// scram-sha-256 password on every network connection.
type Secure struct {
	// CAFile signed CertFile, the certificate of every server (its names
	// must include 127.0.0.1), whose key is KeyFile. Each is copied into
	// the formation's folder, owned by the servers' user.
	CAFile, CertFile, KeyFile string
	// HBAFile replaces every server's pg_hba.conf: rules for network
	// connections that require TLS and a password (hostssl,
	// scram-sha-256), for replication too.
	HBAFile string
	// Password is the password of postgres, of the keepers' user on the
	// monitor (autoctl_node) and of the standbys' (pgautofailover_replicator).
	Password string
}

// Formation is a running pg_auto_failover formation.
type Formation struct {
	// Dir holds every node's data, configuration and log; Stop removes it.
	Dir     string
	Monitor *Node
	Nodes   []*Node
	bin     string
	cred    *syscall.Credential // the servers' user when this process is root
	secure  *Secure             // with the files' copies in Dir; nil: trust, no TLS
}

// Node is the monitor or a data node: a pg_autoctl process group and the
// server it runs.
type Node struct {
	Name string
	Port int
	// Data is the server's data folder.
	Data string
	f    *Formation
	cmd  *exec.Cmd
	done chan struct{}
}

// Available reports whether Start can run: pg_autoctl on PATH and the
// pgautofailover extension installed for the local server, or an error
// that says what to install.
func Available() error {
	bin, err := BinDir()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		return errors.New("pgha: no pg_autoctl on PATH: run scripts/pgautofailover (Debian's pg-auto-failover-cli and postgresql-<version>-auto-failover)")
	}
	share := filepath.Join("/usr/share/postgresql", filepath.Base(filepath.Dir(bin)), "extension", "pgautofailover.control")
	if _, err := os.Stat(share); err != nil {
		return fmt.Errorf("pgha: the pgautofailover extension is not installed for %s: run scripts/pgautofailover", bin)
	}
	return nil
}

// BinDir is the local server's own bin folder (say
// /usr/lib/postgresql/15/bin), a link to initdb followed: pg_autoctl finds
// pg_ctl and the version's extensions from it.
func BinDir() (string, error) {
	bin, err := pgserver.BinDir()
	if err != nil {
		return "", err
	}
	initdb, err := filepath.EvalSymlinks(filepath.Join(bin, "initdb"))
	if err != nil {
		return "", err
	}
	return filepath.Dir(initdb), nil
}

// ServerUser is the user a server runs as: nil (this process's own) or,
// when this process is root (Postgres refuses to run as root), the system
// user postgres.
func ServerUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("pgha: running as root, and Postgres refuses root: create a system user postgres or run as another user")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Start starts a monitor and o.Nodes data nodes on free loopback ports,
// with trust authentication for user postgres (or o.Secure's), and returns
// once the first node is primary and every other a synchronous standby. When this process
// runs as root (Postgres refuses to), every process runs as the system
// user postgres. On an error everything started is stopped.
func Start(ctx context.Context, o Options) (_ *Formation, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.Nodes < 1 || o.Nodes > 9 {
		return nil, fmt.Errorf("pgha: %d data nodes: want 1 to 9", o.Nodes)
	}
	if o.Timing == (Timing{}) {
		o.Timing = FastTiming
	}
	bin, _ := BinDir()
	f := &Formation{bin: bin}
	if f.Dir, err = os.MkdirTemp("", "paymesh-pgha-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = f.Stop()
		}
	}()
	if f.cred, err = ServerUser(); err != nil {
		return nil, err
	}
	if f.cred != nil {
		if err := os.Chown(f.Dir, int(f.cred.Uid), int(f.cred.Gid)); err != nil {
			return nil, err
		}
	}
	if o.Secure != nil {
		if f.secure, err = f.copySecure(*o.Secure); err != nil {
			return nil, err
		}
	}
	if err := f.startMonitor(ctx, o.Timing); err != nil {
		return nil, err
	}
	for range o.Nodes {
		// One at a time: the first is the primary, and a standby is made
		// from it (pg_basebackup) once it is.
		if _, err := f.AddNode(ctx); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// AddNode adds a data node on a free loopback port: the first becomes the
// primary, the next a synchronous standby made from a base backup of it.
// It returns once the formation is healthy again.
func (f *Formation) AddNode(ctx context.Context) (*Node, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("node%d", len(f.Nodes)+1)
	n := &Node{Name: name, Port: port, Data: filepath.Join(f.Dir, name), f: f}
	f.Nodes = append(f.Nodes, n)
	if err := f.create(n); err != nil {
		return nil, err
	}
	if err := f.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	return n, f.secureNode(ctx, n, len(f.Nodes) == 1)
}

// startMonitor creates the monitor, binds it to loopback with t's timers,
// and runs it.
func (f *Formation) startMonitor(ctx context.Context, t Timing) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	m := &Node{Name: "monitor", Port: port, Data: filepath.Join(f.Dir, "monitor"), f: f}
	f.Monitor = m
	args := append([]string{"create", "monitor", "--pgdata", m.Data, "--pgport", strconv.Itoa(port), "--hostname", "127.0.0.1"}, f.authFlags()...)
	if out, err := f.command(args...).CombinedOutput(); err != nil {
		return fmt.Errorf("pgha: pg_autoctl create monitor: %v: %s", err, tail(out))
	}
	if err := f.secureHBA(m); err != nil {
		return err
	}
	// postgresql.auto.conf is read last: it wins over pg_autoctl's
	// listen_addresses = '*'.
	conf := fmt.Sprintf("listen_addresses = '127.0.0.1'\n"+
		"pgautofailover.health_check_period = %d\npgautofailover.health_check_retry_delay = %d\n"+
		"pgautofailover.health_check_timeout = %d\npgautofailover.health_check_max_retries = 1\n"+
		"pgautofailover.node_considered_unhealthy_timeout = %d\npgautofailover.primary_demote_timeout = %d\n",
		t.HealthCheck.Milliseconds(), t.HealthCheck.Milliseconds()/2, t.HealthCheck.Milliseconds(),
		t.Unhealthy.Milliseconds(), t.Demote.Milliseconds())
	if err := f.appendOwned(filepath.Join(m.Data, "postgresql.auto.conf"), conf); err != nil {
		return err
	}
	if err := f.run(m, "run", "--pgdata", m.Data); err != nil {
		return err
	}
	if f.secure != nil {
		// The keepers' user and postgres get their password through the
		// monitor's socket, as its own OS user.
		if err := waitFor(ctx, 60*time.Second, "the monitor's socket", func() error {
			return f.psql(m, "pg_auto_failover", fmt.Sprintf(`ALTER USER autoctl_node PASSWORD %s; ALTER USER postgres PASSWORD %s`,
				quote(f.secure.Password), quote(f.secure.Password)))
		}); err != nil {
			return err
		}
	}
	return waitFor(ctx, 60*time.Second, "the monitor to accept connections", func() error {
		conn, err := f.monitorConn(ctx)
		if err == nil {
			conn.Close(ctx)
		}
		return err
	})
}

// create creates data node n and runs its keeper: it registers with the
// monitor, which makes it the primary or a standby of the primary.
func (f *Formation) create(n *Node) error {
	args := append([]string{"create", "postgres", "--pgdata", n.Data, "--pgport", strconv.Itoa(n.Port), "--listen", "127.0.0.1",
		"--hostname", "127.0.0.1", "--name", n.Name, "--dbname", "paymesh"}, f.authFlags()...)
	return f.run(n, append(args, "--monitor", f.MonitorURL(), "--run")...)
}

// authFlags are pg_autoctl create's flags for f's security: trust and no
// TLS, or the server's certificate, verify-full, and the hba file
// installed by pgha (secureHBA).
func (f *Formation) authFlags() []string {
	if f.secure == nil {
		return []string{"--auth", "trust", "--no-ssl"}
	}
	return []string{"--skip-pg-hba", "--ssl-ca-file", f.secure.CAFile, "--server-cert", f.secure.CertFile,
		"--server-key", f.secure.KeyFile, "--ssl-mode", "verify-full"}
}

// secureNode finishes a secure data node once it runs: on the primary,
// the hba file and the passwords of postgres and of the standbys' user
// (a standby has both from its base backup); on every node, the
// replication password its keeper gives when it follows a primary.
func (f *Formation) secureNode(ctx context.Context, n *Node, primary bool) error {
	if f.secure == nil {
		return nil
	}
	if primary {
		if err := f.secureHBA(n); err != nil {
			return err
		}
		if err := waitFor(ctx, time.Minute, n.Name+"'s socket", func() error {
			return f.psql(n, "postgres", fmt.Sprintf(`SELECT pg_reload_conf(); ALTER USER postgres PASSWORD %s; ALTER USER pgautofailover_replicator PASSWORD %s`,
				quote(f.secure.Password), quote(f.secure.Password)))
		}); err != nil {
			return err
		}
	}
	if out, err := f.command("config", "set", "--pgdata", n.Data, "replication.password", f.secure.Password).CombinedOutput(); err != nil {
		return fmt.Errorf("pgha: %s's replication password: %v: %s", n.Name, err, tail(out))
	}
	return nil
}

// secureHBA installs the hba file in n's data folder (read at the next
// start or reload).
func (f *Formation) secureHBA(n *Node) error {
	if f.secure == nil {
		return nil
	}
	b, err := os.ReadFile(f.secure.HBAFile)
	if err != nil {
		return fmt.Errorf("pgha: %w", err)
	}
	return f.writeOwned(filepath.Join(n.Data, "pg_hba.conf"), b, 0o600)
}

// psql runs sql on node n's server through its socket, as the servers'
// user (peer authentication).
func (f *Formation) psql(n *Node, db, sql string) error {
	// pg_autoctl's servers keep their socket in Postgres's default folder.
	cmd := f.program(filepath.Join(f.bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-h", "/var/run/postgresql", "-p", strconv.Itoa(n.Port), "-d", db, "-c", sql)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("psql on %s: %v: %s", n.Name, err, tail(out))
	}
	return nil
}

// copySecure copies s's files into f.Dir, owned by the servers' user (the
// key readable by it alone, as Postgres requires), and returns s with the
// copies' paths.
func (f *Formation) copySecure(s Secure) (*Secure, error) {
	if s.CAFile == "" || s.CertFile == "" || s.KeyFile == "" || s.HBAFile == "" || s.Password == "" {
		return nil, errors.New("pgha: Secure wants CAFile, CertFile, KeyFile, HBAFile and Password")
	}
	for _, c := range []struct {
		path *string
		name string
	}{{&s.CAFile, "ca.pem"}, {&s.CertFile, "server.pem"}, {&s.KeyFile, "server-key.pem"}} {
		b, err := os.ReadFile(*c.path)
		if err != nil {
			return nil, fmt.Errorf("pgha: %w", err)
		}
		to := filepath.Join(f.Dir, c.name)
		if err := f.writeOwned(to, b, 0o600); err != nil {
			return nil, err
		}
		*c.path = to
	}
	return &s, nil
}

// writeOwned writes a file that the servers' user owns.
func (f *Formation) writeOwned(path string, b []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("pgha: %w", err)
	}
	if f.cred != nil {
		if err := os.Chown(path, int(f.cred.Uid), int(f.cred.Gid)); err != nil {
			return fmt.Errorf("pgha: %w", err)
		}
	}
	return nil
}

// quote is sql's literal s.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// login is the user part of f's URLs, and params their TLS options.
func (f *Formation) login(user string) (string, url.Values) {
	if f.secure == nil {
		return user, url.Values{"sslmode": {"disable"}}
	}
	return url.UserPassword(user, f.secure.Password).String(), url.Values{"sslmode": {"verify-full"}, "sslrootcert": {f.secure.CAFile}}
}

// MonitorURL is the URL keepers reach the monitor at.
func (f *Formation) MonitorURL() string {
	user, q := f.login("autoctl_node")
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/pg_auto_failover?%s", user, f.Monitor.Port, q.Encode())
}

// URL is the URL of database db on whichever node takes writes: every
// data node's address, the one that is read-write chosen at each
// connection (target_session_attrs=read-write), so a pool that connects
// again after a failover finds the new primary.
func (f *Formation) URL(db string) string {
	hosts := make([]string, len(f.Nodes))
	for i, n := range f.Nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.Port)
	}
	user, q := f.login("postgres")
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "2")
	return fmt.Sprintf("postgres://%s@%s/%s?%s", user, strings.Join(hosts, ","), db, q.Encode())
}

// NodeURL is the URL of database db on node n alone.
func (n *Node) NodeURL(db string) string {
	user, q := n.f.login("postgres")
	q.Set("connect_timeout", "2")
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?%s", user, n.Port, db, q.Encode())
}

// command is pg_autoctl with args, as the servers' user, in its own
// process group, with its configuration and state kept in f.Dir.
func (f *Formation) command(args ...string) *exec.Cmd { return f.program("pg_autoctl", args...) }

// program is prog with args, run as command runs pg_autoctl.
func (f *Formation) program(prog string, args ...string) *exec.Cmd {
	cmd := exec.Command(prog, args...)
	cmd.Dir = f.Dir
	cmd.Env = []string{
		"PATH=" + f.bin + ":/usr/bin:/bin",
		"HOME=" + f.Dir,
		"XDG_CONFIG_HOME=" + filepath.Join(f.Dir, "config"),
		"XDG_DATA_HOME=" + filepath.Join(f.Dir, "share"),
		"XDG_RUNTIME_DIR=" + filepath.Join(f.Dir, "run"),
		"LANG=C.UTF-8",
	}
	if f.secure != nil {
		// A standby's base backup, before its keeper has the replication
		// password in its configuration.
		cmd.Env = append(cmd.Env, "PGPASSWORD="+f.secure.Password)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: f.cred}
	return cmd
}

// run starts pg_autoctl with args as n's process group, logging to
// <Dir>/<name>.log.
func (f *Formation) run(n *Node, args ...string) error {
	log, err := os.OpenFile(filepath.Join(f.Dir, n.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := f.command(args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgha: pg_autoctl %s: %w", strings.Join(args[:2], " "), err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(n.done) }()
	return nil
}

// State is a node's state as the monitor holds it.
type State struct {
	Name string
	// Reported is the state the node's keeper last reported; Goal is the
	// one the monitor assigned it.
	Reported, Goal string
}

// States returns the data nodes' states, as the monitor holds them.
func (f *Formation) States(ctx context.Context) ([]State, error) {
	return MonitorStates(ctx, f.Monitor.NodeURL("pg_auto_failover"))
}

// MonitorStates returns the data nodes' states of the default formation,
// in the order they registered, from the monitor at url (its database
// pg_auto_failover, as any user that may call pgautofailover.current_state:
// the keepers' autoctl_node does).
func MonitorStates(ctx context.Context, url string) ([]State, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT nodename, current_group_state::text, assigned_group_state::text
		FROM pgautofailover.current_state('default') ORDER BY node_id`)
	if err != nil {
		return nil, fmt.Errorf("pgha: node states: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[State])
}

// Healthy says why states are not those of a healthy formation (one node
// primary and every other a secondary, each at its goal; a lone node
// single), or "" when they are.
func Healthy(states []State) string {
	var primaries int
	var why []string
	for _, s := range states {
		switch {
		case s.Reported == "primary" && s.Goal == "primary", len(states) == 1 && s.Reported == "single" && s.Goal == "single":
			primaries++
		case s.Reported == "secondary" && s.Goal == "secondary":
		default:
			why = append(why, fmt.Sprintf("%s %s→%s", s.Name, s.Reported, s.Goal))
		}
	}
	if primaries != 1 && len(why) == 0 {
		why = append(why, fmt.Sprintf("%d primaries", primaries))
	}
	return strings.Join(why, ", ")
}

// Writer returns the name of the node of states that takes writes: the
// one that has reached a primary's goal (primary, wait_primary, single),
// or "".
func Writer(states []State) string {
	for _, s := range states {
		if s.Reported == s.Goal && (s.Goal == "primary" || s.Goal == "wait_primary" || s.Goal == "single") {
			return s.Name
		}
	}
	return ""
}

// Primary returns the node that takes writes, as the monitor has it, or
// nil when none does.
func (f *Formation) Primary(ctx context.Context) (*Node, error) {
	states, err := f.States(ctx)
	if err != nil {
		return nil, err
	}
	return f.writer(states), nil
}

// writer returns the node of states that takes writes, or nil.
func (f *Formation) writer(states []State) *Node { return f.node(Writer(states)) }

// WaitHealthy waits until every data node has reached its goal, one the
// primary and every other a secondary (a synchronous standby). While a
// standby is being made it asks the primary for a checkpoint: pg_autoctl's
// pg_basebackup waits for a spread one otherwise, up to minutes.
func (f *Formation) WaitHealthy(ctx context.Context) error {
	return waitFor(ctx, 3*time.Minute, "every node to be primary or secondary", func() error {
		states, err := f.States(ctx)
		if err != nil {
			return err
		}
		why := Healthy(states)
		if len(states) != len(f.Nodes) {
			why = strings.TrimPrefix(why+fmt.Sprintf(", %d of %d nodes registered", len(states), len(f.Nodes)), ", ")
		}
		if why == "" {
			return nil
		}
		if p := f.writer(states); p != nil {
			_ = p.exec(ctx, "CHECKPOINT")
		}
		return fmt.Errorf("nodes: %s", why)
	})
}

// WaitPrimary waits until a node other than old takes writes, as the
// monitor has it and as a connection finds it, and returns it.
func (f *Formation) WaitPrimary(ctx context.Context, old *Node) (*Node, error) {
	var p *Node
	err := waitFor(ctx, 3*time.Minute, "another node to take writes", func() error {
		var err error
		if p, err = f.Primary(ctx); err != nil {
			return err
		}
		if p == nil || p == old {
			return errors.New("no new primary yet")
		}
		return p.exec(ctx, "CREATE TEMP TABLE pgha_probe (x int)")
	})
	return p, err
}

// Kill kills node n as a crash of its machine would: its keeper and every
// server process, with SIGKILL. The monitor finds it unhealthy on its own.
func (f *Formation) Kill(n *Node) error {
	if n.cmd == nil {
		return fmt.Errorf("pgha: %s is not running", n.Name)
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	// The server's processes, its backends among them, all work in its
	// data folder: whatever pg_autoctl started outside its group dies too.
	for _, pid := range ProcessesIn(n.Data) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-n.done
	n.cmd = nil
	return nil
}

// Rejoin brings killed node n back as a new machine would come: its data
// folder wiped, dropped from the monitor and registered again under its
// name and port, made a standby of the primary from a fresh base backup.
// It returns once the formation is healthy again.
func (f *Formation) Rejoin(ctx context.Context, n *Node) error {
	if n.cmd != nil {
		return fmt.Errorf("pgha: %s is running: Kill it first", n.Name)
	}
	if out, err := f.command("drop", "node", "--monitor", f.MonitorURL(), "--formation", "default", "--name", n.Name, "--force").CombinedOutput(); err != nil {
		return fmt.Errorf("pgha: pg_autoctl drop node %s: %v: %s", n.Name, err, tail(out))
	}
	for _, d := range []string{n.Data, filepath.Join(f.Dir, "config", "pg_autoctl", n.Data), filepath.Join(f.Dir, "share", "pg_autoctl", n.Data)} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	if err := f.create(n); err != nil {
		return err
	}
	if err := f.WaitHealthy(ctx); err != nil {
		return err
	}
	return f.secureNode(ctx, n, false)
}

// SetQuorum says whether node n takes part in the write quorum: a node
// outside it is an asynchronous standby, which a commit does not wait for.
func (f *Formation) SetQuorum(ctx context.Context, n *Node, on bool) error {
	conn, err := f.monitorConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pgautofailover.set_node_replication_quorum('default', $1, $2)`, n.Name, on); err != nil {
		return fmt.Errorf("pgha: replication quorum of %s: %w", n.Name, err)
	}
	return nil
}

// PauseReplication stops primary n's WAL senders (SIGSTOP) until the
// returned resume is called: its standbys fall behind as on a slow link,
// and a commit that waits for one of them waits. (Stopping a standby's
// receiver instead would not do: the kernel still takes in what the
// sender sends, up to the socket's buffer.)
func (n *Node) PauseReplication(ctx context.Context) (resume func() error, err error) {
	conn, err := pgx.Connect(ctx, n.NodeURL("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		return nil, fmt.Errorf("pgha: %s's WAL senders: %w", n.Name, err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return nil, fmt.Errorf("pgha: %s has no WAL sender (%v)", n.Name, err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("pgha: pausing %s's WAL sender: %w", n.Name, err)
		}
	}
	return func() error {
		var errs []error
		for _, pid := range pids {
			errs = append(errs, syscall.Kill(int(pid), syscall.SIGCONT))
		}
		return errors.Join(errs...)
	}, nil
}

// WaitSetting waits, up to a minute, until node n's setting name reads
// want: the monitor's changes reach a node's configuration through its
// keeper, a moment later.
func (n *Node) WaitSetting(ctx context.Context, name, want string) error {
	var got string
	return waitFor(ctx, time.Minute, fmt.Sprintf("%s's %s to be %q", n.Name, name, want), func() error {
		conn, err := pgx.Connect(ctx, n.NodeURL("postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&got); err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("it is %q", got)
		}
		return nil
	})
}

// Stop stops every process of the formation and removes its folder.
func (f *Formation) Stop() error {
	nodes := append([]*Node{}, f.Nodes...)
	if f.Monitor != nil {
		nodes = append(nodes, f.Monitor)
	}
	for _, n := range nodes {
		if n.cmd != nil {
			_ = f.Kill(n)
		}
	}
	return os.RemoveAll(f.Dir)
}

func (f *Formation) node(name string) *Node {
	for _, n := range f.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func (f *Formation) monitorConn(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, f.Monitor.NodeURL("pg_auto_failover"))
}

// exec runs one statement on node n itself.
func (n *Node) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, n.NodeURL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// appendOwned appends s to a file of the servers' user.
func (f *Formation) appendOwned(path, s string) error {
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgha: %w", err)
	}
	_, err = file.WriteString(s)
	return errors.Join(err, file.Close())
}

// ProcessesIn returns the processes whose working folder is dir: a
// Postgres server's, which all work in its data folder.
func ProcessesIn(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dir {
			out = append(out, pid)
		}
	}
	return out
}

// waitFor calls check until it returns nil, every 200 ms, for at most
// limit; the error then names what was awaited and check's last word.
func waitFor(ctx context.Context, limit time.Duration, what string, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgha: waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
