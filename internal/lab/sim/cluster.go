package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/paymesh/paymesh/internal/lab/compose"
	"github.com/paymesh/paymesh/platform/subjects"
)

// leaderKillFor is how long the node leading a stream stays down: longer
// than the Raft election timeout of nats-server (4 to 9 s after the last
// heartbeat), so the two nodes left elect a new leader while it is gone and
// the restarted node comes back as a follower that catches up.
const leaderKillFor = 10 * time.Second

// leaderElectWait bounds how much longer than leaderKillFor the killed
// leader stays down while the two nodes left have not named a new one.
const leaderElectWait = 20 * time.Second

// monitorURL returns the http:// base of a nats service's monitor port on
// the host.
func (s *sim) monitorURL(service string) (string, error) {
	mon, err := s.mapper.Addr(fmt.Sprintf("%s:%d", service, natsMonitorPort))
	if err != nil {
		return "", err
	}
	return "http://" + mon, nil
}

// getJSON decodes the JSON answer of a GET into v; an answer other than
// 200 is an error with its status.
func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, res.Status)
	}
	if v == nil {
		return nil
	}
	return json.NewDecoder(res.Body).Decode(v)
}

// waitHealthy waits until every nats dependency of service that compose
// makes it wait for (condition service_healthy) answers its healthcheck,
// the monitor port's /healthz: for a node of a region's cluster, once the
// cluster has a JetStream meta leader and the node is current. It returns
// an error naming the node and its last answer after startTimeout.
func (s *sim) waitHealthy(ctx context.Context, service string) error {
	for _, dep := range slices.Sorted(maps.Keys(s.plan.project.Services[service].DependsOn)) {
		if s.plan.project.Services[service].DependsOn[dep] != compose.ServiceHealthy || s.plan.kinds[dep] != kindNATS {
			continue
		}
		base, err := s.monitorURL(dep)
		if err != nil {
			return fmt.Errorf("sim: %s: %w", dep, err)
		}
		deadline := time.Now().Add(startTimeout)
		for {
			err := getJSON(ctx, base+"/healthz", nil)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sim: %s (which %s waits for) not healthy after %s: %v", dep, service, startTimeout, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// jszStreams is the part of nats-server's /jsz?streams=true answer that
// names each stream's cluster leader.
type jszStreams struct {
	Accounts []struct {
		Streams []struct {
			Name    string `json:"name"`
			Cluster *struct {
				Leader string `json:"leader"`
			} `json:"cluster"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

// streamLeader returns the server name of the node leading stream in a
// region's cluster, asking the nodes' monitor ports in turn until one
// names it. A node's server_name is its compose service (NATS_SERVER_NAME
// in docker-compose.yml). It returns an error when no node names a leader
// (the stream has none, or every node is down).
func (s *sim) streamLeader(ctx context.Context, region, stream string) (string, error) {
	r, ok := s.table.Get(region)
	if !ok {
		return "", fmt.Errorf("no region %s", region)
	}
	var lastErr error
	for _, node := range r.NodeNames() {
		if s.plan.kinds[node] != kindNATS {
			continue
		}
		base, err := s.monitorURL(node)
		if err != nil {
			return "", err
		}
		var j jszStreams
		if err := getJSON(ctx, base+"/jsz?accounts=true&streams=true", &j); err != nil {
			lastErr = err
			continue
		}
		for _, a := range j.Accounts {
			for _, st := range a.Streams {
				if st.Name == stream && st.Cluster != nil && st.Cluster.Leader != "" {
					return st.Cluster.Leader, nil
				}
			}
		}
		lastErr = fmt.Errorf("%s names no leader of %s", node, stream)
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("docker-compose.yml has no nats node of region %s", region)
	}
	return "", lastErr
}

// leaderKillFault kills, with SIGKILL, the node of a region's cluster
// that leads its ledger stream at the time it fires, and starts it again
// leaderKillFor later. The report records which node it was and which
// node led the stream while it was down.
func (s *sim) leaderKillFault(region string, at time.Duration) fault {
	stream := subjects.LedgerStream(region)
	var killed string
	return fault{Name: FaultKillLeader, At: at, For: leaderKillFor,
		What: fmt.Sprintf("kill -9 the nats-server leading %s, restart it %s later", stream, leaderKillFor),
		fire: func(ctx context.Context) error {
			leader, err := s.streamLeader(ctx, region, stream)
			if err != nil {
				return fmt.Errorf("find the leader of %s: %w", stream, err)
			}
			p := s.procs.get(leader)
			if p == nil {
				return fmt.Errorf("%s is led by %s, which is no process of the simulation", stream, leader)
			}
			p.kill9()
			killed = leader
			s.logf("fault %s: killed %s, the leader of %s", FaultKillLeader, leader, stream)
			return nil
		},
		undo: func(ctx context.Context) error {
			// The node stays down until the two left have elected a
			// leader, for at most leaderElectWait more: an election takes
			// 4 to 9 s after the last heartbeat, more on a loaded machine.
			now, err := s.streamLeader(ctx, region, stream)
			for end := time.Now().Add(leaderElectWait); err != nil && time.Now().Before(end) && ctx.Err() == nil; {
				time.Sleep(250 * time.Millisecond)
				now, err = s.streamLeader(ctx, region, stream)
			}
			if err != nil {
				now = "none (" + err.Error() + ")"
			}
			s.mu.Lock()
			s.leaderKills = append(s.leaderKills, LeaderKill{Stream: stream, Killed: killed, LeaderWhileDown: now})
			s.mu.Unlock()
			return s.procs.get(killed).restart()
		},
	}
}

// LeaderKill is one kill of a stream's leader: the node killed and the
// node that led the stream just before it was restarted.
type LeaderKill struct {
	Stream, Killed, LeaderWhileDown string
}
