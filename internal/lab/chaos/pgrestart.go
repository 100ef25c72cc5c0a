package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgRestart is scenario 6's state: when the last restart returned, and
// how many transfers each region's ledger had applied then.
type pgRestart struct {
	last    atomic.Int64 // unix nanoseconds
	applied map[string]int64
}

// pgRestartScenario is the scenario 6: the regions' databases live
// on a Postgres cluster the run starts from the local binaries, and while
// the workload runs that cluster is restarted twice with pg_ctl restart -m
// immediate (every server process killed, crash recovery on start). Every
// open connection of the ledgers, the routers' outbox relays and the APIs
// breaks; their transactions fail and are retried or redelivered, and the
// pools connect again once the server is back.
func pgRestartScenario() *scenario {
	st := &pgRestart{}
	return &scenario{
		name: "6-pg-restart",
		what: "the regions' Postgres (a throwaway cluster the run starts with initdb) restarted with pg_ctl restart -m " +
			"immediate, twice, at 10% and 35% of the run (each takes 0.5-1 s): every connection breaks mid-transaction and the server runs " +
			"crash recovery",
		counts:      "Postgres immediate restarts",
		ownPostgres: true,
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			if e.cfg.asyncCommit {
				if err := asyncCommit(ctx, e.pg.URL); err != nil {
					return err
				}
			}
			start := time.Now()
			for _, f := range []float64{0.1, 0.35} {
				if !at(ctx, start, d, f) {
					return nil
				}
				if err := e.pg.Restart(context.WithoutCancel(ctx)); err != nil {
					return err
				}
				e.fired.Add(1)
				st.last.Store(time.Now().UnixNano())
				st.applied = e.appliedNow()
			}
			return nil
		},
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			chk := Check{Name: "recovered", What: "the ledgers applied transfers after the last restart, and every region's " +
				"API is ready and reads an account from its database", OK: true, Checked: 1}
			if st.last.Load() == 0 {
				chk.fail("no restart completed")
				return []Check{chk}, nil
			}
			e.recovered(ctx, &chk, st.applied, "the last restart")
			return []Check{chk}, nil
		},
	}
}

// recovered checks, after a fault that took the regions' database away,
// that the ledgers applied transfers after it (more than applied, by
// region, when it ended), and that every region's API is ready and reads
// an account from its database.
func (e *env) recovered(ctx context.Context, chk *Check, applied map[string]int64, fault string) {
	var before, after int64
	for _, n := range e.names {
		before += applied[n]
		after += e.c.Region(n).Ledger.Stats.Applied.Load()
	}
	if after <= before {
		chk.fail("the ledgers applied nothing after %s (%d applied before it)", fault, before)
	}
	for _, n := range e.names {
		chk.Checked++
		url := e.c.Region(n).APIURL
		for _, path := range []string{"/readyz", "/v1/accounts/" + e.accts[n][0]} {
			if code, err := e.get(ctx, url+path); err != nil || code != http.StatusOK {
				chk.fail("region %s: GET %s answered %d (%v) after %s", n, path, code, err, fault)
			}
		}
	}
}

// appliedNow returns how many transfers each region's ledger has applied.
func (e *env) appliedNow() map[string]int64 {
	out := map[string]int64{}
	for _, n := range e.names {
		out[n] = e.c.Region(n).Ledger.Stats.Applied.Load()
	}
	return out
}

// get sends an authenticated GET and returns the status code.
func (e *env) get(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+e.apiKey)
	res, err := e.http.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, nil
}

// asyncCommit is scenario 6's deliberate bug (Config.asyncCommit): the
// server acknowledges COMMIT before its WAL is written out
// (synchronous_commit off, the WAL writer asleep for 10 s), so an
// immediate restart forgets transactions the ledger already acknowledged
// to JetStream.
func asyncCommit(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		`ALTER SYSTEM SET synchronous_commit = off`,
		`ALTER SYSTEM SET wal_writer_delay = '10s'`,
		`SELECT pg_reload_conf()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

func init() { registry = append(registry, pgRestartScenario) }
