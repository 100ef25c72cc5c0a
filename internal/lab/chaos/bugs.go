package chaos

import (
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
)

// bugs are the deliberate bugs of the suite's own tests (bugs_test.go):
// each removes the protection one scenario attacks, so that the test can
// show the checker catches its absence. The zero value installs nothing.
type bugs struct {
	IgnoreKeyBody        bool // scenario 1
	AckBeforeCommit      bool // scenario 2
	SeenBeforeCommit     bool // scenario 3
	DedupByTransferID    bool // scenario 4
	AssumeCommitted      bool // scenario 5
	RelayIgnoresPubAck   bool // scenario 7
	ForwardIgnoresPubAck bool // scenario 8
	NoRetry              bool // scenario 9
	ForgetKeyTransfer    bool // scenario 10
	SkipOwnerCheck       bool // scenario 11
}

// install puts the bugs that are on into the cluster's services.
func (b bugs) install(c *cluster.Config) {
	// Scenario 1.
	if b.IgnoreKeyBody {
		wrapAPIStore(c, func(s api.Store) api.Store { return ignoreKeyBody{s} })
	}

	// Scenario 2.
	c.Bugs.AckBeforeCommit = b.AckBeforeCommit

	// Scenario 3.
	c.Bugs.SeenBeforeCommit = b.SeenBeforeCommit

	// Scenario 4.
	c.Bugs.DedupByTransferID = b.DedupByTransferID

	// Scenario 5.
	c.Bugs.AssumeCommitted = b.AssumeCommitted

	// Scenario 7.
	c.Bugs.RelayIgnoresPubAck = b.RelayIgnoresPubAck

	// Scenario 8.
	c.Bugs.ForwardIgnoresPubAck = b.ForwardIgnoresPubAck

	// Scenario 9.
	c.Bugs.NoRetry = b.NoRetry

	// Scenario 10.
	if b.ForgetKeyTransfer {
		wrapAPIStore(c, func(s api.Store) api.Store { return forgetKeyTransfer{s} })
	}

	// Scenario 11.
	if b.SkipOwnerCheck {
		wrapAPIStore(c, func(s api.Store) api.Store { return skipOwnerCheck{s} })
	}
}
