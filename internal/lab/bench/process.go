package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// ProcessRun is the uniform workload applied by `paymesh ledger` in a
// process of its own, as it runs in production: its peak RSS and CPU are
// the ledger's alone, without the publisher, nats-server or the bench's
// bookkeeping.
type ProcessRun struct {
	Transfers int     `json:"transfers"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"rate"`
	// PeakRSSMB is the ledger process's VmHWM.
	PeakRSSMB        float64 `json:"peak_rss_mb"`
	CPUPerTransferUs float64 `json:"cpu_per_transfer_us"`
	Verified         bool    `json:"verified"`
	VerifyReport     string  `json:"verify_report,omitempty"`
}

func (p ProcessRun) line() string {
	return fmt.Sprintf("%-13s %8.0f/s  %d transfers in %.1fs  ledger process: peak RSS %.0f MB, CPU %.0f µs/msg  %s",
		LedgerProcess, p.Rate, p.Transfers, p.Seconds, p.PeakRSSMB, p.CPUPerTransferUs, invariants(p.Verified, p.VerifyReport))
}

// ledgerProcess runs `<binary> ledger` on a database of its own and the
// bench's nats-server, publishes the uniform workload, and reads the
// process's peak RSS and CPU from /proc when every transfer is recorded.
func (e *env) ledgerProcess(ctx context.Context) (ProcessRun, error) {
	name := e.cfg.DatabasePrefix + "ledger_process"
	url, err := e.createDB(ctx, name)
	if err != nil {
		return ProcessRun{}, err
	}
	if err := e.resetStreams(ctx); err != nil {
		return ProcessRun{}, err
	}
	// The schema, the streams and the funded accounts, from this process;
	// the consumers run in the child only.
	setup, err := ledgerd.Open(ctx, ledgerd.Config{Region: region, Regions: e.regions, Node: 2, PostgresURL: url, NATSURL: e.nats.url,
		Shards: e.cfg.Shards, CacheSize: 0})
	if err != nil {
		return ProcessRun{}, err
	}
	accounts, err := openAccounts(ctx, e, setup.Store, region, e.cfg.Accounts)
	store := setup.Store
	if err != nil {
		setup.Close()
		return ProcessRun{}, err
	}
	defer setup.Close()

	child, err := e.startService(ctx, e.ledgerArgs(name, 3)...)
	if err != nil {
		return ProcessRun{}, err
	}
	defer child.stop()
	pid := child.pid()

	w, err := e.newWorkload(LedgerProcess+fmt.Sprint(e.seq.Add(1)), e.cfg.Transfers, len(accounts), -1)
	if err != nil {
		return ProcessRun{}, err
	}
	topo := ledgerstream.Topology{Region: region, Shards: e.cfg.Shards}
	cpu0, _ := procCPU(pid)
	first := time.Now()
	var done atomic.Int64
	stop := e.progress(LedgerProcess, func() (int64, int64) { return done.Load(), int64(len(w.from)) })
	for i := range w.from {
		w.created[i] = time.Now().UnixNano()
		cmd := w.command(e, accounts, i)
		m := nats.NewMsg(topo.CommandSubject(cmd, topo.Region))
		m.Data = cmd.Encode()
		m.Header.Set(jetstream.MsgIDHeader, cmd.MsgKey())
		if _, err := e.nats.js.PublishMsgAsync(m, jetstream.WithExpectStream(topo.Stream())); err != nil {
			stop()
			return ProcessRun{}, fmt.Errorf("publish: %w", err)
		}
	}
	select {
	case <-e.nats.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		stop()
		return ProcessRun{}, errors.New("publishes not acked within a minute")
	}
	// Every transfer is recorded once committed; a minute without progress
	// fails the run.
	last, since := int64(-1), time.Now()
	for done.Load() < int64(len(w.from)) {
		var n int64
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM transfers WHERE type = 'transfer'`).Scan(&n); err != nil {
			stop()
			return ProcessRun{}, err
		}
		done.Store(n)
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > time.Minute {
			stop()
			return ProcessRun{}, fmt.Errorf("the ledger process committed nothing for a minute (%d of %d)", n, len(w.from))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	elapsed := time.Since(first)
	run := ProcessRun{Transfers: len(w.from), Seconds: elapsed.Seconds(), Rate: float64(len(w.from)) / elapsed.Seconds()}
	if cpu1, ok := procCPU(pid); ok {
		run.CPUPerTransferUs = float64((cpu1 - cpu0).Microseconds()) / float64(len(w.from))
	}
	if run.PeakRSSMB, err = vmHWM(pid); err != nil {
		return run, err
	}
	rep, err := store.Verify(ctx)
	if err != nil {
		return run, err
	}
	run.Verified = rep.OK()
	if !run.Verified {
		run.VerifyReport = rep.String()
	}
	return run, nil
}

// service is a paymesh service running in a process of its own.
type service struct {
	name string
	cmd  *exec.Cmd
	out  *tail // the end of its stdout and stderr, for the error when it fails
	done chan struct{}
	err  error // Wait's, once done is closed
	// unscrape stops the bench's scrapes of its /metrics.
	unscrape func()
}

// startService runs `<LedgerBinary> args...` (a service: args[0] is its
// command). With the bench's telemetry it exports its traces as deployed
// and serves /metrics, which the bench scrapes (its --metrics-listen off
// becomes a free port); without it, tracing is off. The process gets
// SIGTERM when ctx ends, and ten seconds to exit.
func (e *env) startService(ctx context.Context, args ...string) (*service, error) {
	args = slices.Clone(args)
	env := append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	var metrics string
	if e.tel != nil {
		env = append(os.Environ(), e.tel.env("paymesh-"+args[0])...)
		if i := slices.Index(args, "--metrics-listen"); i >= 0 && i+1 < len(args) {
			addr, err := freeAddr()
			if err != nil {
				return nil, err
			}
			args[i+1], metrics = addr, "http://"+addr+"/metrics"
		}
	}
	cmd := exec.CommandContext(ctx, e.cfg.LedgerBinary, args...)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	s := &service{name: args[0], cmd: cmd, out: &tail{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", e.cfg.LedgerBinary, args[0], err)
	}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	s.unscrape = e.scrape(metrics) // none without the telemetry or a --metrics-listen
	return s, nil
}

func (s *service) pid() int { return s.cmd.Process.Pid }

// stop sends SIGTERM and waits for the process to exit.
func (s *service) stop() {
	s.unscrape()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
}

// failed returns an error naming the service, its exit and its last output
// when the process has ended, nil while it runs.
func (s *service) failed() error {
	select {
	case <-s.done:
		return fmt.Errorf("paymesh %s exited (%v): %s", s.name, s.err, s.out)
	default:
		return nil
	}
}

// tail keeps the last 4 KiB written to it; it is safe for concurrent use.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = append(t.b[:0:0], t.b[len(t.b)-4096:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// ledgerArgs is `paymesh ledger` on database db of the run's Postgres and
// the bench's nats-server, sized as the in-process ledger runs.
func (e *env) ledgerArgs(db string, node int) []string {
	return []string{"ledger", "--region", region,
		"--postgres-url", e.cfg.PostgresURL, "--database", db, "--nats-url", e.nats.url, "--metrics-listen", "off",
		"--shards", strconv.Itoa(e.cfg.Shards), "--batch-size", strconv.Itoa(e.cfg.BatchSize),
		"--workers", strconv.Itoa(e.cfg.Workers), "--cache-size", strconv.Itoa(e.cfg.CacheSize), "--node", strconv.Itoa(node),
		"--insecure-dev"} // the bench's own servers: no users, no TLS
}

// vmHWM reads a process's peak resident set size, in MB, from
// /proc/<pid>/status.
func vmHWM(pid int) (float64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				return 0, fmt.Errorf("VmHWM %q: %w", rest, err)
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
