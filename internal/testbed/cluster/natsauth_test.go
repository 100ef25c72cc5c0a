package cluster_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestServicesRunAsTheirNATSUsers: every region's ledger, router and API
// are connected to their region's server as their own users of
// platform/natsauth, and with those permissions a cross-region transfer and
// its saga go through to COMPLETED.
func TestServicesRunAsTheirNATSUsers(t *testing.T) {
	h := mustCluster(t, nil, nil)
	for _, r := range []string{"eu", "us", "ap"} {
		cz, err := h.topo.Server(r).Connz(&server.ConnzOptions{Username: true})
		if err != nil {
			t.Fatal(err)
		}
		var users []string
		for _, c := range cz.Conns {
			if c.Kind == "Client" && !slices.Contains(users, c.AuthorizedUser) {
				users = append(users, c.AuthorizedUser)
			}
		}
		slices.Sort(users)
		want := []string{natsauth.UserName(natsauth.API, r), natsauth.UserName(natsauth.Ledger, r), natsauth.UserName(natsauth.Router, r)}
		if !slices.Equal(users, want) {
			t.Errorf("region %s: connections as %q, want %q", r, users, want)
		}
	}

	h.open(t, 1, 1_000)
	cmd := h.transfer(t, h.accts["eu"][0], h.accts["us"][0], 250)
	if err := h.c.Submit(t.Context(), "ap", cmd); err != nil {
		t.Fatal(err)
	}
	h.quiet(t, time.Minute)
	if tr := h.final(t, cmd); tr.Status != ledger.StatusCompleted {
		t.Fatalf("transfer eu -> us submitted in ap: %s, want COMPLETED", tr.Status)
	}
	h.verify(t)
}
