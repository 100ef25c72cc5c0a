package sim

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestRestartPolicy: a process whose compose service restarts unless
// stopped is started again each time it exits on its own, as docker does;
// once the simulation stops it, it stays down.
func TestRestartPolicy(t *testing.T) {
	ps, err := newProcs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := ps.start(procSpec{Name: "flaky", Path: "/bin/sh", Args: []string{"-c", "echo up; exit 3"}, Restart: true})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for p.restarted() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("restarted %d times in a minute, want 3", p.restarted())
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop(time.Second)
	if got := ps.restarted()["flaky"]; got < 3 {
		t.Errorf("procs.restarted() = %d for flaky, want at least 3", got)
	}
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "---- sim: start "); n < 4 {
		t.Errorf("the log shows %d starts, want at least 4:\n%s", n, b)
	}
	if failed := ps.failed(); len(failed) != 1 || !strings.HasPrefix(failed[0], "flaky exited") {
		t.Errorf("failed() = %q, want flaky", failed)
	}
}
