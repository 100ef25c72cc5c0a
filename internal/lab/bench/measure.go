package bench

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuTime is this process's user plus system CPU time so far: the ledger,
// the publisher and the embedded nats-server all run in it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSS is the process's peak resident set so far, in bytes (Linux
// reports ru_maxrss in KiB). It never goes down: it is the high-water mark
// of the whole run up to now.
func peakRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Maxrss * 1024
}

// clockTick is USER_HZ, the unit of the CPU times in /proc/<pid>/stat; it
// is 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procCPU reads the user plus system CPU time of a process from
// /proc/<pid>/stat. ok is false when the file cannot be read (another
// machine, another PID namespace, or the process is gone).
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: the fields that
	// follow are counted from the last ')'. utime and stime are fields 14
	// and 15 of the line, the 12th and 13th after the name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * clockTick, true
}

// pgBackends snapshots the CPU time of the Postgres backends connected to
// database db, by PID. It is empty when Postgres runs where /proc cannot
// see it.
func pgBackends(ctx context.Context, pool *pgxpool.Pool, db string) map[int]time.Duration {
	out := map[int]time.Duration{}
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1`, db)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) != nil {
			continue
		}
		if t, ok := procCPU(pid); ok {
			out[pid] = t
		}
	}
	return out
}

// pgCPUDelta is the CPU the backends of after used since before; a backend
// that connected in between counts from zero. ok is false when no backend
// could be read.
func pgCPUDelta(before, after map[int]time.Duration) (time.Duration, bool) {
	var d time.Duration
	for pid, t := range after {
		d += t - before[pid]
	}
	return d, len(after) > 0
}

// percentile returns the q-quantile of sorted (nearest rank), 0 for none.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1)+0.5)]
}

// latencies returns the publish→commit latencies of the committed messages,
// sorted.
func latencies(published, committed []int64) []time.Duration {
	out := make([]time.Duration, 0, len(committed))
	for i, c := range committed {
		if c != 0 && published[i] != 0 {
			out = append(out, time.Duration(c-published[i]))
		}
	}
	slices.Sort(out)
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
