package chaos

import (
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/ledger/server"
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
	c.Bugs.IgnoreKeyBody = b.IgnoreKeyBody

	// Scenario 2.
	c.Bugs.AckBeforeCommit = b.AckBeforeCommit

	// Scenario 3.
	if b.SeenBeforeCommit {
		wrapConsumeLog(c, func(l postgres.ConsumeLog) postgres.ConsumeLog { return seenBeforeCommit{l} })
	}

	// Scenario 4 (with Config.dropBusinessKey).
	if b.DedupByTransferID {
		onLedger(c, func(lc *server.Config) { lc.RequestKey = keyByTransferID })
	}

	// Scenario 5.
	if b.AssumeCommitted {
		wrapConsumeLog(c, func(l postgres.ConsumeLog) postgres.ConsumeLog { return assumeCommitted{l} })
	}

	// Scenario 7.
	c.Bugs.RelayIgnoresPubAck = b.RelayIgnoresPubAck

	// Scenario 8.
	c.Bugs.ForwardIgnoresPubAck = b.ForwardIgnoresPubAck

	// Scenario 9.
	c.Bugs.NoRetry = b.NoRetry

	// Scenario 10.
	c.Bugs.ForgetKeyTransfer = b.ForgetKeyTransfer

	// Scenario 11.
	c.Bugs.SkipOwnerCheck = b.SkipOwnerCheck
}
