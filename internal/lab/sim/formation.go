package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/testbed/pgha"
)

// A region's highly available database in docker-compose.yml: a monitor
// and data nodes of pg_auto_failover, each a service of the image built
// from deploy/postgres, whose entrypoint (deploy/postgres/formation) the
// simulation runs as it is, one process per service.
const (
	// formationImage is the image compose builds from deploy/postgres.
	formationImage = "paymesh-postgres"
	// formationHome is the folder the image keeps everything of a server
	// in (PGAF_HOME of deploy/postgres/Dockerfile), a volume in compose.
	formationHome = "/var/lib/postgresql/formation"
	// formationStart bounds a server's start: a data node's creation
	// includes a base backup of the primary.
	formationStart = 3 * time.Minute
	// formationHealthyWait bounds the wait for a formation to be healthy
	// (a primary and its synchronous standbys, each at its goal): at
	// start, before the primary is killed, and after the wiped node
	// starts again.
	formationHealthyWait = 3 * time.Minute
)

// FaultKillPostgres kills eu's Postgres primary, then brings the node
// back with its folder wiped (pgFailoverFault).
const FaultKillPostgres = "kill-postgres-eu-primary"

// formationScript is the image's entrypoint in the repository.
func (s *sim) formationScript() string {
	return filepath.Join(s.cfg.Root, "deploy", "postgres", "formation")
}

// formationSpec is how a formation service runs here: the entrypoint with
// compose's command (monitor or node) and environment mapped to loopback
// and the run folder, its volume as PGAF_HOME, listening on its published
// port of 127.0.0.1 under that address, as the servers' user.
func (s *sim) formationSpec(name string) (procSpec, error) {
	svc := s.plan.project.Services[name]
	port, ok := svc.Published(5432)
	if !ok {
		return procSpec{}, fmt.Errorf("sim: %s publishes no Postgres port (5432)", name)
	}
	env, err := s.env(name)
	if err != nil {
		return procSpec{}, err
	}
	m, err := s.mounts(name)
	if err != nil {
		return procSpec{}, err
	}
	home := m[formationHome]
	if home == "" {
		return procSpec{}, fmt.Errorf("sim: %s mounts no volume at %s, where the image keeps the server", name, formationHome)
	}
	bin, err := pgha.BinDir()
	if err != nil {
		return procSpec{}, err
	}
	cred, err := pgha.ServerUser()
	if err != nil {
		return procSpec{}, err
	}
	for k, v := range map[string]string{
		"PGAF_HOME": home, "PGPORT": strconv.Itoa(port), "PGAF_HOSTNAME": "127.0.0.1", "PGAF_LISTEN": "127.0.0.1",
		"PATH": bin + ":/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
	} {
		env[k] = v
	}
	return procSpec{Name: name, Path: s.formationScript(), Args: mappedPaths(m, svc.Command), Env: env, Credential: cred,
		Leftovers: filepath.Join(home, "data"), Restart: slices.Contains([]string{"always", "unless-stopped", "on-failure"}, svc.Restart)}, nil
}

// startFormationNode starts a monitor or a data node and waits until its
// compose healthcheck ("formation health") passes.
func (s *sim) startFormationNode(ctx context.Context, name string) error {
	spec, err := s.formationSpec(name)
	if err != nil {
		return err
	}
	if err := s.ownForServer(spec); err != nil {
		return err
	}
	p, err := s.procs.start(spec)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := s.waitFormationHealth(ctx, p); err != nil {
		return err
	}
	s.logf("  %-14s pg_auto_failover %s, pid %d, on 127.0.0.1:%s, ready in %s", name, strings.Join(spec.Args, " "), p.pid(),
		spec.Env["PGPORT"], time.Since(start).Round(100*time.Millisecond))
	return nil
}

// ownForServer gives the servers' user what compose gives the image's
// postgres user: its volume, the way to it through the run folder, and
// the group of its key (compose's certs service runs in the image's
// postgres group, and Postgres takes a key of root's readable by its
// group).
func (s *sim) ownForServer(spec procSpec) error {
	c := spec.Credential
	if c == nil {
		return nil
	}
	if err := os.Chmod(s.dir, 0o755); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := os.Chown(spec.Env["PGAF_HOME"], int(c.Uid), int(c.Gid)); err != nil {
		return fmt.Errorf("sim: %s: %w", spec.Name, err)
	}
	if key := spec.Env["PGAF_KEY_FILE"]; key != "" {
		if err := os.Chown(key, -1, int(c.Gid)); err != nil {
			return fmt.Errorf("sim: %s: %w", spec.Name, err)
		}
	}
	return nil
}

// waitFormationHealth runs the service's healthcheck until it passes, for
// at most formationStart; it fails early when the process exits.
func (s *sim) waitFormationHealth(ctx context.Context, p *proc) error {
	deadline := time.Now().Add(formationStart)
	for {
		cmd := exec.CommandContext(ctx, p.spec.Path, "health")
		cmd.Env = environ(p.spec.Env)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.spec.Credential}
		if cmd.Run() == nil {
			return nil
		}
		if done, exitErr := p.exited(); done {
			return fmt.Errorf("sim: %s exited before it was healthy (%v): %s", p.spec.Name, exitErr, tail(p.log, 8))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: %s not healthy after %s: %s", p.spec.Name, formationStart, tail(p.log, 8))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// formationRegions returns the regions whose database is a formation in
// docker-compose.yml.
func (s *sim) formationRegions() []regions.Region {
	var out []regions.Region
	for _, r := range s.table.Regions {
		if s.plan.kinds[r.PostgresMonitorName()] == kindFormation {
			out = append(out, r)
		}
	}
	return out
}

// formationMonitor returns the URL a region's data nodes reach its monitor at
// (their PGAF_MONITOR, mapped to loopback).
func (s *sim) formationMonitor(r regions.Region) (string, error) {
	env, err := s.env(r.PostgresNodeName(0))
	if err != nil {
		return "", err
	}
	if env["PGAF_MONITOR"] == "" {
		return "", fmt.Errorf("sim: %s has no PGAF_MONITOR", r.PostgresNodeName(0))
	}
	return env["PGAF_MONITOR"], nil
}

// formationService returns the compose service of the data node the
// monitor names node (its PGAF_NAME), or "".
func (s *sim) formationService(r regions.Region, node string) string {
	for _, name := range r.PostgresNodeNames() {
		if s.plan.project.Services[name].Environment["PGAF_NAME"] == node {
			return name
		}
	}
	return ""
}

// waitFormation waits until a region's formation is healthy, for at most
// limit, and returns its states. Meanwhile it asks the primary for a
// checkpoint: a standby's base backup waits for one, and a spread one
// takes minutes.
func (s *sim) waitFormation(ctx context.Context, r regions.Region, limit time.Duration) ([]pgha.State, error) {
	monitor, err := s.formationMonitor(r)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var why string
	for {
		states, err := pgha.MonitorStates(ctx, monitor)
		switch {
		case err != nil:
			why = err.Error()
		default:
			why = pgha.Healthy(states)
			if why == "" && len(states) == len(r.PostgresNodeNames()) {
				return states, nil
			}
			if why == "" {
				why = fmt.Sprintf("%d of %d nodes registered", len(states), len(r.PostgresNodeNames()))
			}
			if pgha.Writer(states) != "" {
				_ = s.regionExec(ctx, r, "CHECKPOINT")
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("sim: %s's database not healthy after %s: %s", r.Name, limit, why)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// regionExec runs one statement on a region's writable server, through
// its ledger's multi-host URL.
func (s *sim) regionExec(ctx context.Context, r regions.Region, sql string) error {
	url, err := s.regionDB(r)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// waitFormations waits until every formation is healthy and logs who
// leads each.
func (s *sim) waitFormations(ctx context.Context) error {
	for _, r := range s.formationRegions() {
		states, err := s.waitFormation(ctx, r, formationHealthyWait)
		if err != nil {
			return err
		}
		var parts []string
		for _, st := range states {
			parts = append(parts, st.Name+" "+st.Reported)
		}
		s.logf("  %s's database: %s (monitor %s)", r.Name, strings.Join(parts, ", "), r.PostgresMonitorName())
	}
	return nil
}

// Failover is what the kill of a region's Postgres primary cost.
type Failover struct {
	Region string
	// Killed is the primary's service; Promoted the node that took
	// writes after it.
	Killed, Promoted string
	KilledAt         time.Time
	// Writable is the time from the kill to the first write through the
	// services' multi-host URL on the new primary.
	Writable time.Duration
	// LastOld and FirstNew are the last commit on the old primary and the
	// first on the new, by the times the ledger's transactions wrote
	// (events' clock_timestamp, transfers' applied_at), read after the
	// load; Gap the time between them.
	LastOld, FirstNew time.Time
	Gap               time.Duration
	// Rejoined is the time from the wiped node's start to a healthy
	// formation again (it a synchronous standby).
	Rejoined time.Duration
	// Requests are the acknowledged requests in flight between the kill
	// and the first write on the new primary; Retried those the client
	// sent more than once (a 5xx, a network error), MaxTries the most.
	Requests, Retried, MaxTries int
	Errors                      []string
}

// pgFailoverFault kills a region's Postgres primary (its keeper and
// server, with SIGKILL) once the formation is healthy (pg_auto_failover
// never fails over a primary still waiting for its standby), watches the
// standby take writes, and d later wipes the killed node's folder and
// starts it again: it registers anew and rejoins as a standby.
func (s *sim) pgFailoverFault(region string, at, d time.Duration) fault {
	var killed string
	return fault{Name: FaultKillPostgres, At: at, For: d,
		What: fmt.Sprintf("kill -9 %s's Postgres primary, wipe its folder and start it again %s later (it rejoins as a standby)", region, d),
		fire: func(ctx context.Context) error {
			r, ok := s.table.Get(region)
			if !ok || s.plan.kinds[r.PostgresMonitorName()] != kindFormation {
				return fmt.Errorf("docker-compose.yml runs no highly available database for region %s", region)
			}
			states, err := s.waitFormation(ctx, r, formationHealthyWait)
			if err != nil {
				return fmt.Errorf("before the kill: %w", err)
			}
			old := pgha.Writer(states)
			svc := s.formationService(r, old)
			p := s.procs.get(svc)
			if p == nil {
				return fmt.Errorf("the primary %s is no process of the simulation", old)
			}
			fo := &Failover{Region: region, Killed: svc, KilledAt: time.Now()}
			p.kill9()
			killed = svc
			s.mu.Lock()
			s.failover = fo
			s.mu.Unlock()
			s.logf("fault %s: killed %s (%s), the primary", FaultKillPostgres, svc, old)
			s.failoverDone = make(chan struct{})
			go s.watchFailover(ctx, r, old, fo)
			return nil
		},
		undo: func(ctx context.Context) error {
			p := s.procs.get(killed)
			<-s.failoverDone
			home := p.spec.Env["PGAF_HOME"]
			entries, err := os.ReadDir(home)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := os.RemoveAll(filepath.Join(home, e.Name())); err != nil {
					return err
				}
			}
			started := time.Now()
			if err := p.restart(); err != nil {
				return err
			}
			s.logf("fault %s: %s wiped (%d entries) and started again", FaultKillPostgres, killed, len(entries))
			s.rejoinDone = make(chan struct{})
			go func() {
				defer close(s.rejoinDone)
				r, _ := s.table.Get(region)
				_, err := s.waitFormation(ctx, r, formationHealthyWait)
				s.mu.Lock()
				defer s.mu.Unlock()
				if err != nil {
					s.failover.Errors = append(s.failover.Errors, "rejoin: "+err.Error())
					return
				}
				s.failover.Rejoined = time.Since(started)
				s.logf("fault %s: %s rejoined as a standby in %s", FaultKillPostgres, killed, s.failover.Rejoined.Round(100*time.Millisecond))
			}()
			return nil
		},
	}
}

// watchFailover waits until another node than old takes writes, as the
// monitor has it and as the services' URL finds it, and records when.
func (s *sim) watchFailover(ctx context.Context, r regions.Region, old string, fo *Failover) {
	defer close(s.failoverDone)
	monitor, err := s.formationMonitor(r)
	for err == nil {
		var states []pgha.State
		if states, err = pgha.MonitorStates(ctx, monitor); err == nil {
			if w := pgha.Writer(states); w != "" && w != old && s.regionExec(ctx, r, "SELECT 1") == nil {
				s.mu.Lock()
				fo.Promoted, fo.Writable = s.formationService(r, w), time.Since(fo.KilledAt)
				s.mu.Unlock()
				s.logf("fault %s: %s takes writes, %s after the kill", FaultKillPostgres, fo.Promoted, fo.Writable.Round(10*time.Millisecond))
				return
			}
		} else if ctx.Err() == nil && time.Since(fo.KilledAt) < formationHealthyWait {
			err = nil // the monitor may be busy: ask again
		}
		if time.Since(fo.KilledAt) > formationHealthyWait {
			err = fmt.Errorf("no other node took writes within %s", formationHealthyWait)
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	s.mu.Lock()
	fo.Errors = append(fo.Errors, "failover: "+err.Error())
	s.mu.Unlock()
}

// measureFailover fills in what the failover cost once the load is over:
// the last commit on the old primary and the first on the new, from the
// region's database, and the acknowledged requests in flight meanwhile,
// from the load's history.
func (s *sim) measureFailover(ctx context.Context, rep *Report) {
	s.mu.Lock()
	fo := s.failover
	s.mu.Unlock()
	if fo == nil {
		return
	}
	rep.Failover = fo
	if s.rejoinDone != nil {
		select {
		case <-s.rejoinDone:
		case <-ctx.Done():
		}
	}
	if fo.Promoted == "" {
		return
	}
	if last, first, err := s.commitsAround(ctx, fo.Region, fo.KilledAt); err != nil {
		fo.Errors = append(fo.Errors, err.Error())
	} else {
		fo.LastOld, fo.FirstNew, fo.Gap = last, first, first.Sub(last)
	}
	until := fo.KilledAt.Add(fo.Writable).UnixMilli()
	for _, e := range rep.history {
		if e.Sent == 0 || e.Sent > until || e.Answered < fo.KilledAt.UnixMilli() {
			continue
		}
		fo.Requests++
		if e.Tries > 1 {
			fo.Retried++
		}
		fo.MaxTries = max(fo.MaxTries, e.Tries)
	}
}

// commitsAround returns a region's last commit before at and its first
// after, by the times its ledger's transactions wrote (events'
// clock_timestamp, transfers' applied_at: a transaction's start, and
// none starts on a server after it died), read once the load is over.
func (s *sim) commitsAround(ctx context.Context, region string, at time.Time) (last, first time.Time, err error) {
	store := s.stores[region]
	if store == nil {
		return last, first, fmt.Errorf("commit times: no database of region %s", region)
	}
	var l, f *time.Time
	err = store.Pool().QueryRow(ctx, `
		SELECT (SELECT max(t) FROM (SELECT max(created_at) t FROM events WHERE created_at < $1
		                            UNION ALL SELECT max(applied_at) FROM transfers WHERE applied_at < $1) o),
		       (SELECT min(t) FROM (SELECT min(created_at) t FROM events WHERE created_at > $1
		                            UNION ALL SELECT min(applied_at) FROM transfers WHERE applied_at > $1) n)`, at).Scan(&l, &f)
	switch {
	case err != nil:
		return last, first, fmt.Errorf("commit times: %w", err)
	case l == nil || f == nil:
		return last, first, errors.New("commit times: no write before the kill, or none after it")
	}
	return *l, *f, nil
}

// ServiceKill is the kill of a region's ledger (FaultKillLedger): the
// region's last commit before it and first after.
type ServiceKill struct {
	Service, Region string
	KilledAt        time.Time
	// Gap is the time between the region's last commit before the kill
	// and its first after it.
	Gap   time.Duration
	Error string `json:",omitempty"`
}

// measureKills fills in the gap of each ledger kill.
func (s *sim) measureKills(ctx context.Context, rep *Report) {
	s.mu.Lock()
	kills := slices.Clone(s.ledgerKills)
	s.mu.Unlock()
	for _, k := range kills {
		last, first, err := s.commitsAround(ctx, k.Region, k.KilledAt)
		if err != nil {
			k.Error = err.Error()
		} else {
			k.Gap = first.Sub(last)
		}
		rep.LedgerKills = append(rep.LedgerKills, k)
	}
}

// check is the report's verdict on the failover.
func (fo *Failover) check() (bool, string, string) {
	ok := fo.Promoted != "" && fo.Promoted != fo.Killed && fo.Rejoined > 0 && fo.Gap > 0 && len(fo.Errors) == 0
	name := fmt.Sprintf("%s's Postgres failed over: %s killed, %s took writes %s later (last commit on the old primary → first on the new: %s); "+
		"%s rejoined wiped, as a standby, in %s; %d requests in flight, %d retried (at most %d tries)",
		fo.Region, fo.Killed, or(fo.Promoted, "no node"), fo.Writable.Round(10*time.Millisecond), fo.Gap.Round(10*time.Millisecond),
		fo.Killed, fo.Rejoined.Round(100*time.Millisecond), fo.Requests, fo.Retried, fo.MaxTries)
	return ok, name, strings.Join(fo.Errors, "\n")
}
