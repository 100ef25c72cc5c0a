package dashboard

import (
	"context"
	"maps"
	"slices"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// ClusterSource watches the regions of an in-process cluster.
type ClusterSource struct{ C *cluster.Cluster }

// Regions returns the cluster's region names.
func (s ClusterSource) Regions() []string { return slices.Sorted(slices.Values(s.C.Names())) }

// Sample reads each region's ledger, router and API counters, and its
// transfers in transit. Duplicates are counted by the layer that caught
// them: the ledger's layers, JetStream's Nats-Msg-Id window at the router,
// and Idempotency-Key replays at the API.
func (s ClusterSource) Sample(ctx context.Context) (map[string]RegionSample, error) {
	out := map[string]RegionSample{}
	for _, name := range s.C.Names() {
		r := s.C.Region(name)
		st := r.Ledger.Stats
		rs := r.Router.Stats()
		n, _, err := r.Ledger.Store.InTransit(ctx)
		if err != nil {
			return nil, err
		}
		dups := maps.Clone(st.Duplicates())
		if dups == nil {
			dups = map[string]int64{}
		}
		dups[string(ledger.LayerMsgID)] += rs.DuplicateSubmits.Load() + rs.ForwardDuplicates.Load() + rs.RelayDuplicates.Load()
		if r.API != nil {
			dups[string(ledger.LayerIdempotencyKey)] += r.API.Stats.Replays.Load()
		}
		out[name] = RegionSample{Applied: st.Applied.Load(), Deliveries: st.Deliveries.Load(), Redeliveries: st.Redeliveries.Load(),
			DeadLetters: st.DeadLettered.Load(), InTransit: n, Duplicates: dups}
	}
	return out, nil
}

// Verify checks each region's own invariants, each in one snapshot of its
// database. The checks across regions need every region at rest, so they
// run once traffic stops (VerifyGlobal), not here.
func (s ClusterSource) Verify(ctx context.Context) (postgres.Report, error) {
	rep := postgres.Report{Region: "all"}
	for _, name := range s.Regions() {
		r, err := s.C.Region(name).Ledger.Store.Verify(ctx)
		if err != nil {
			return rep, err
		}
		for _, c := range r.Checks {
			c.Name = name + ": " + c.Name
			rep.Checks = append(rep.Checks, c)
		}
	}
	return rep, nil
}
