package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy/faultproxytest"
)

// buildPaymesh builds the paymesh-lab binary into a temporary directory.
func buildPaymesh(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "paymesh-lab")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestWANCommand runs `paymesh-lab wan` as a process: it relays to its target
// with the asked latency, answers its control API, and exits 0 on SIGTERM.
// Bad flags make it exit non-zero with a message naming the flag.
func TestWANCommand(t *testing.T) {
	bin := buildPaymesh(t)
	target := faultproxytest.Echo(t)

	cmd, start := startWAN(t, bin, nil, "--link", "us", "--listen", "127.0.0.1:0", "--target", target,
		"--control", "127.0.0.1:0", "--latency", "30ms", "--jitter", "1ms")
	m := regexp.MustCompile(`listen=(\S+) target=(\S+) control=(\S+) shape="latency 30ms jitter 1ms reset_rate 0/s"`).FindStringSubmatch(start)
	if m == nil || m[2] != target {
		t.Fatalf("start line: got %q, want listen, target %s, control and shape", start, target)
	}
	listen, control := m[1], m[3]

	c, err := net.Dial("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	begin := time.Now()
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("relay: got %q, %v", got, err)
	}
	if took := time.Since(begin); took < 58*time.Millisecond {
		t.Fatalf("round trip took %s, want at least 2×(30ms-1ms)", took)
	}

	st, err := faultproxy.NewClient(control).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Shape.Latency != 30*time.Millisecond || st.Accepted != 1 || st.Target != target {
		t.Fatalf("status: got %+v", st)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still running 5s after SIGTERM")
	}

	// Without --latency the link plays the table's one-way delay of the
	// region's link; the environment sets the flags as well.
	_, start = startWAN(t, bin, []string{"PAYMESH_WAN_LINK=eu", "PAYMESH_WAN_LISTEN=127.0.0.1:0", "PAYMESH_WAN_CONTROL=off", "PAYMESH_WAN_RESET_RATE=0.5"})
	if want := `link=eu listen=127.0.0.1:`; !strings.Contains(start, want) || !strings.Contains(start, `control=off shape="latency 37.5ms jitter 0s reset_rate 0.5/s"`) {
		t.Fatalf("start line from the environment: got %q, want eu's link with the table's 37.5ms and reset rate 0.5", start)
	}

	for name, tt := range map[string]struct {
		args []string
		want string
	}{
		"NegativeLatency": {[]string{"--link", "eu", "--latency=-5ms"}, "latency -5ms is negative"},
		"BadLatency":      {[]string{"--link", "eu", "--latency", "slow"}, `--latency "slow"`},
		"UnknownLink":     {[]string{"--link", "mars"}, `--link "mars": unknown region`},
		"NegativeRate":    {[]string{"--link", "eu", "--reset-rate=-1"}, "reset_rate -1"},
		"NoListen":        {nil, "--listen: no address"},
	} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"wan", "--listen", "127.0.0.1:0", "--control", "off"}, tt.args...)
			if name == "NoListen" {
				args = []string{"wan"}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 || !strings.Contains(string(out), tt.want) {
				t.Fatalf("got %v:\n%s\nwant a non-zero exit and %q", err, out, tt.want)
			}
		})
	}
}

// startWAN starts `paymesh-lab wan` with args and extra environment, and
// returns the process and its first log line. The process is killed at
// cleanup.
func startWAN(t *testing.T, bin string, env []string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"wan"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(stderr)
	var start string
	if lines.Scan() {
		start = lines.Text()
	}
	go io.Copy(io.Discard, stderr)
	return cmd, start
}
