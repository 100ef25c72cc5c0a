package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgha"
)

// procSpec is how to start one service's process.
type procSpec struct {
	Name string   // the compose service name; its log is logs/<Name>.log
	Path string   // the binary
	Args []string // its arguments
	Env  map[string]string
	// Restart starts the process again when it exits on its own, as
	// compose's restart policies (unless-stopped, always, on-failure) do:
	// after 100 ms, doubling up to restartMax for each exit that comes
	// within restartReset of its start.
	Restart bool
	// Credential, when set, is the user the process runs as (a Postgres
	// server refuses root).
	Credential *syscall.Credential
	// Leftovers, when set, is a folder whose processes (those working in
	// it) die with the process: a Postgres server's, whose data folder
	// they all work in, wherever its keeper started them.
	Leftovers string
}

// Automatic restarts: docker's own backoff.
const (
	restartFirst = 100 * time.Millisecond
	restartMax   = 10 * time.Second
	restartReset = 10 * time.Second
)

// proc is one started process, in its own process group so that a kill
// reaches whatever it started.
type proc struct {
	spec procSpec
	log  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	exitErr error
	starts  int
	// held is set while the simulation itself has stopped the process
	// (a fault's kill, the end of the run): it is not restarted then.
	held bool
	// autoStarts counts the restarts by the policy; backoff is the next
	// one's delay, started when the last run began.
	autoStarts int
	backoff    time.Duration
	startedAt  time.Time
}

// procs supervises the simulation's processes.
type procs struct {
	dir string // logs go to dir/logs

	mu    sync.Mutex
	order []*proc // in start order
	byKey map[string]*proc
}

func newProcs(dir string) (*procs, error) {
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("sim: log folder: %w", err)
	}
	return &procs{dir: dir, byKey: map[string]*proc{}}, nil
}

// failed returns, for each process whose last run exited with an error
// (a one-shot job that ended well does not count), its name, exit status
// and the last lines of its log.
func (ps *procs) failed() []string {
	var out []string
	for _, p := range ps.list() {
		if done, err := p.exited(); done && err != nil {
			out = append(out, fmt.Sprintf("%s exited (%v): %s", p.spec.Name, err, tail(p.log, 8)))
		}
	}
	return out
}

// restarted returns how many times the restart policy started each
// process again, for those it did.
func (ps *procs) restarted() map[string]int {
	out := map[string]int{}
	for _, p := range ps.list() {
		if n := p.restarted(); n > 0 {
			out[p.spec.Name] = n
		}
	}
	return out
}

// start starts a process for spec, its stdout and stderr appended to
// logs/<name>.log. It returns an error when the binary cannot start.
func (ps *procs) start(spec procSpec) (*proc, error) {
	p := &proc{spec: spec, log: filepath.Join(ps.dir, "logs", spec.Name+".log")}
	if err := p.run(); err != nil {
		return nil, err
	}
	ps.mu.Lock()
	ps.order = append(ps.order, p)
	ps.byKey[spec.Name] = p
	ps.mu.Unlock()
	return p, nil
}

// list returns the processes in start order.
func (ps *procs) list() []*proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return slices.Clone(ps.order)
}

// get returns the named process, or nil.
func (ps *procs) get(name string) *proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.byKey[name]
}

// stopAll stops every process, the last started first. Each gets SIGTERM
// for its whole group and grace to exit, then SIGKILL.
func (ps *procs) stopAll(grace time.Duration) {
	order := ps.list()
	for i := len(order) - 1; i >= 0; i-- {
		order[i].stop(grace)
	}
}

// run starts the process once more.
func (p *proc) run() error { return p.runAfter(nil) }

// runAfter starts the process once more; with a prev run, only if that run
// is still the last and the simulation has not stopped the process since
// (the restart policy's start).
func (p *proc) runAfter(prev chan struct{}) error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("sim: %s: log: %w", p.spec.Name, err)
	}
	defer f.Close() // the child holds its own copy
	p.mu.Lock()
	defer p.mu.Unlock()
	if prev != nil {
		if p.held || p.done != prev {
			return nil
		}
		p.autoStarts++
	}
	p.starts++
	fmt.Fprintf(f, "---- sim: start %d of %s: %s %s\n", p.starts, p.spec.Name, p.spec.Path, strings.Join(p.spec.Args, " "))
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = environ(p.spec.Env)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.spec.Credential}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sim: start %s (%s): %w", p.spec.Name, p.spec.Path, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.exitErr, p.held, p.startedAt = cmd, done, nil, false, time.Now()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(done)
		p.restartByPolicy(done)
	}()
	return nil
}

// restartByPolicy starts the process again after the backoff when its
// spec asks for it and the simulation did not stop it; done is the run
// that exited, so a run started meanwhile (a fault's undo) is left alone.
func (p *proc) restartByPolicy(done chan struct{}) {
	p.mu.Lock()
	if !p.spec.Restart || p.held {
		p.mu.Unlock()
		return
	}
	if time.Since(p.startedAt) >= restartReset || p.backoff == 0 {
		p.backoff = restartFirst
	}
	delay := p.backoff
	p.backoff = min(2*p.backoff, restartMax)
	p.mu.Unlock()
	time.Sleep(delay)
	_ = p.runAfter(done)
}

// restarted returns how many times the restart policy started the
// process again.
func (p *proc) restarted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.autoStarts
}

// environ is the child's environment: PATH and HOME of this process (the
// services need no more of it) and env, sorted.
func environ(env map[string]string) []string {
	var out []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "GOCOVERDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			if _, set := env[k]; !set {
				out = append(out, k+"="+v)
			}
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// pid returns the running process's id (0 when it has exited).
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// wait waits for the process to exit and returns its exit error, or
// ctx's error.
func (p *proc) wait(ctx context.Context) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.exitErr != nil {
			return fmt.Errorf("%s exited: %w (see %s)", p.spec.Name, p.exitErr, p.log)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// exited reports whether the process has exited, and how.
func (p *proc) exited() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return true, p.exitErr
	default:
		return false, nil
	}
}

// hold keeps the restart policy from starting the process again until
// the simulation itself does.
func (p *proc) hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// signal sends sig to the process's group.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// kill9 kills the process group with SIGKILL, as a crash would, and
// the processes working in its Leftovers folder, and waits for it to be
// gone.
func (p *proc) kill9() {
	p.hold()
	p.signal(syscall.SIGKILL)
	if p.spec.Leftovers != "" {
		for _, pid := range pgha.ProcessesIn(p.spec.Leftovers) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.wait(ctx)
}

// restart starts the process again after it exited.
func (p *proc) restart() error {
	if done, _ := p.exited(); !done {
		return fmt.Errorf("sim: restart %s: still running", p.spec.Name)
	}
	return p.run()
}

// stop sends SIGTERM to the group, and SIGKILL after grace to it and to
// what is left working in its Leftovers folder.
func (p *proc) stop(grace time.Duration) {
	p.hold()
	p.signal(syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := p.wait(ctx); errors.Is(err, context.DeadlineExceeded) {
		p.kill9()
		return
	}
	for p.spec.Leftovers != "" && len(pgha.ProcessesIn(p.spec.Leftovers)) > 0 {
		select {
		case <-ctx.Done():
			p.kill9()
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
