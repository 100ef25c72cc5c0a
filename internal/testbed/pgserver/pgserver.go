package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
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
	opts   string // the server options, kept for Restart
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
}

// StartThrowawayWith is StartThrowaway with options. It returns an error
// naming the port when a fixed Port is taken or out of range.
func StartThrowawayWith(ctx context.Context, o ThrowawayOptions) (*Throwaway, error) {
	if o.Port < 0 || o.Port > 65535 {
		return nil, fmt.Errorf("throwaway postgres: port %d out of range", o.Port)
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
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, errors.New("running as root, and initdb refuses root: create a system user postgres or run as another user")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		t.asUser = "postgres"
	}
	port := o.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := t.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	t.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on", port, dir)
	if out, err := t.run(ctx, "pg_ctl", "-D", data, "-o", t.opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	t.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return t, nil
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
