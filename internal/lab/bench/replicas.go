package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
)

// startSamples is how many times the replicas scenario starts each
// topology; it reports the median.
const startSamples = 3

// ReplicasRun sets R1 and R3 side by side: the time an embedded topology
// of the bench's region takes to start with one server and with a cluster
// of three (JetStream usable), and the uniform run again on the cluster
// with R3 streams. The R1 throughput is the uniform run's.
type ReplicasRun struct {
	// StartR1Seconds and StartR3Seconds are the medians of startSamples
	// starts; StartsR1 and StartsR3 are every sample.
	StartR1Seconds float64   `json:"start_r1_seconds"`
	StartR3Seconds float64   `json:"start_r3_seconds"`
	StartsR1       []float64 `json:"starts_r1"`
	StartsR3       []float64 `json:"starts_r3"`
	// R3 is the uniform run on the cluster: the ledger and the publisher
	// connected to all three servers, LEDGER and DLQ at three replicas.
	R3 LedgerRun `json:"r3"`
}

// natsTarget is where the ledger runs send and read: the bench's own
// server, or a topology's region with its users.
type natsTarget struct {
	url            string
	user, password string // the ledger's user; empty on the bench's server
	replicas       int    // of the ledger's streams; 0 for one
	js             jetstream.JetStream
	// admin deletes the streams between runs (the publisher's user may
	// not); nil means js.
	admin jetstream.JetStream
}

// replicas measures ReplicasRun.
func (e *env) replicas(ctx context.Context) (ReplicasRun, error) {
	var run ReplicasRun
	dir, err := os.MkdirTemp("", "paymesh-bench-r3-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(dir)
	start := func(nodes, sample int) (*natsembed.Topology, float64, error) {
		began := time.Now()
		topo, err := natsembed.StartTopology(natsembed.TopologyOptions{Regions: []string{region}, Nodes: nodes,
			Dir: fmt.Sprintf("%s/r%d-%d", dir, nodes, sample)})
		return topo, time.Since(began).Seconds(), err
	}
	var topo *natsembed.Topology
	for i := range startSamples {
		t1, s1, err := start(1, i)
		if err != nil {
			return run, err
		}
		t1.Shutdown()
		if topo != nil {
			topo.Shutdown()
		}
		var s3 float64
		if topo, s3, err = start(3, i); err != nil {
			return run, err
		}
		run.StartsR1, run.StartsR3 = append(run.StartsR1, s1), append(run.StartsR3, s3)
	}
	defer topo.Shutdown()
	run.StartR1Seconds, run.StartR3Seconds = median(run.StartsR1), median(run.StartsR3)
	fmt.Fprintf(e.out, "%-13s topology start (median of %d): R1 %.2fs, R3 %.2fs\n", Replicas, startSamples, run.StartR1Seconds, run.StartR3Seconds)

	connect := func(service string) (*nats.Conn, natsauth.User, error) {
		u, err := natsauth.UserOf(region, service)
		if err != nil {
			return nil, u, err
		}
		nc, err := nats.Connect(topo.ClientURL(region), append(natsauth.ConnectOptions(u.Name, u.Password),
			nats.Name("paymesh-bench-r3-"+service), nats.MaxReconnects(-1))...)
		return nc, u, err
	}
	pub, _, err := connect(natsauth.Router) // the router's user publishes to ledger subjects
	if err != nil {
		return run, err
	}
	defer pub.Close()
	adm, lu, err := connect(natsauth.Ledger)
	if err != nil {
		return run, err
	}
	defer adm.Close()
	target := natsTarget{url: topo.ClientURL(region), user: lu.Name, password: lu.Password, replicas: topo.Replicas(region)}
	if target.js, err = jetstream.New(pub, jetstream.WithPublishAsyncMaxPending(e.cfg.Window)); err != nil {
		return run, err
	}
	if target.admin, err = jetstream.New(adm); err != nil {
		return run, err
	}
	saved := e.nats
	e.nats = target
	defer func() { e.nats = saved }()
	r3, rig, _, err := e.uniformRun(ctx, Replicas, e.cfg.BatchSize, false, 0, e.cfg.Limit, "")
	if err != nil {
		return run, err
	}
	rig.close(ctx)
	run.R3 = r3
	return run, nil
}

// median returns the middle of xs (the upper middle of an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// printReplicas writes the R1 and R3 table.
func (r Result) printReplicas(w io.Writer) {
	p := r.Replicas
	u, haveU := r.RunOf(Uniform)
	if p == nil || !haveU {
		return
	}
	fmt.Fprintf(w, "R1 vs R3 (one region; start = topology up with JetStream usable, median of %d; uniform at the same sizes):\n", startSamples)
	fmt.Fprintf(w, "  %-28s %10s %18s %10s %10s\n", "replicas", "start", "uniform", "p50", "p99")
	fmt.Fprintf(w, "  %-28s %9.2fs %13.0f tr/s %7.1f ms %7.1f ms\n", "R1 (one server)", p.StartR1Seconds, u.Rate, u.P50Ms, u.P99Ms)
	fmt.Fprintf(w, "  %-28s %9.2fs %13.0f tr/s %7.1f ms %7.1f ms\n", "R3 (a cluster of three)", p.StartR3Seconds, p.R3.Rate, p.R3.P50Ms, p.R3.P99Ms)
}
