package chaos

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
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
	StepsIgnorePubAck    bool // scenario 7: the ledgers' step sender and the relays
	ForwardIgnoresPubAck bool // scenario 8
	NoRetry              bool // scenario 9
	ForgetKeyTransfer    bool // scenario 10
	ClassBlind           bool // scenario 12
	LostDeadLetters      bool // scenario 15
	SkipOwnerCheck       bool // scenario 11
	RefundKeyedByParent  bool // scenario 1
	ExpiryClockBehind    bool // scenario 10
	UncheckedForwards    bool // scenario 16
	IgnoreRevocation     bool // scenario 17
	AttemptBlind         bool // scenario 1
	// The webhook receiver's (hooks.go), installed by the scenarios
	// themselves: they build the receiver.
	HookEffectOutsideTx bool // scenario 18
	HookCommitLater     bool // scenario 19
	HookSwallowErrors   bool // scenario 20
	HookEndlessLease    bool // scenario 21
}

// install puts the bugs that are on into the cluster's services.
func (b bugs) install(c *cluster.Config) {
	// Scenario 1.
	if b.IgnoreKeyBody {
		wrapAPIStore(c, func(s api.Store) api.Store { return ignoreKeyBody{s} })
	}

	// Scenario 2.
	if b.AckBeforeCommit {
		// On the claimed path, where every client request passes the
		// ledger's consumer: a request the API applies itself is acked by
		// no consumer, early or not.
		claimKeys(c)
		onLedger(c, func(lc *ledgerd.Config) { lc.WrapJetStream = wrapped(lc.WrapJetStream, ackBeforeApply) })
	}

	// Scenario 3.
	if b.SeenBeforeCommit {
		wrapConsumeLog(c, func(l postgres.ConsumeLog) postgres.ConsumeLog { return seenBeforeCommit{l} })
	}

	// Scenario 4 (with Config.dropBusinessKey).
	if b.DedupByTransferID {
		wrapConsumeLog(c, func(l postgres.ConsumeLog) postgres.ConsumeLog { return keyByTransferID{l} })
	}

	// Scenario 5.
	if b.AssumeCommitted {
		wrapConsumeLog(c, func(l postgres.ConsumeLog) postgres.ConsumeLog { return assumeCommitted{l} })
	}

	// Scenario 1, the causes check.
	if b.AttemptBlind {
		wrapRouterJetStream(c, func(js jetstream.JetStream) jetstream.JetStream { return attemptBlind{js} })
	}

	// Scenario 7: both senders of saga steps, the ledger that committed
	// them and the relay.
	if b.StepsIgnorePubAck {
		stepsAcked := func(js jetstream.JetStream) jetstream.JetStream { return ackedAnyway{JetStream: js, fake: relayed} }
		wrapRouterJetStream(c, stepsAcked)
		onLedger(c, func(lc *ledgerd.Config) { lc.WrapJetStream = wrapped(lc.WrapJetStream, stepsAcked) })
	}

	// Scenario 8.
	if b.ForwardIgnoresPubAck {
		wrapRouterJetStream(c, func(js jetstream.JetStream) jetstream.JetStream { return ackedAnyway{JetStream: js, fake: forwarded} })
	}

	// Scenario 9.
	if b.NoRetry {
		onLedger(c, func(lc *ledgerd.Config) { lc.MaxAttempts = 1 }) // the first retryable error gives up
	}

	// Scenario 10.
	if b.ForgetKeyTransfer {
		// On the claimed path, where the lookup decides: a resend the API
		// submits unclaimed is folded by the ledger stream's window and
		// the ledger's business key whatever the lookup says.
		claimKeys(c)
		wrapAPIStore(c, func(s api.Store) api.Store { return forgetKeyTransfer{s} })
	}

	// Scenario 12, the ledger's class check.
	if b.ClassBlind {
		onLedger(c, func(lc *ledgerd.Config) { lc.WrapJetStream = wrapped(lc.WrapJetStream, classBlind(lc.Regions)) })
	}

	// Scenario 15.
	if b.LostDeadLetters {
		onLedger(c, func(lc *ledgerd.Config) {
			if lc.Region == poisonRegion {
				region := lc.Region
				lc.WrapJetStream = wrapped(lc.WrapJetStream, func(js jetstream.JetStream) jetstream.JetStream { return lostDeadLetters{js, region} })
			}
		})
	}

	// Scenario 11.
	if b.SkipOwnerCheck {
		// The ledger checks a transfer's source owner too: the bug takes
		// that check away as well, and runs the claimed key path, where
		// every request passes the ledger's consumer.
		wrapAPIStore(c, func(s api.Store) api.Store { return skipOwnerCheck{s} })
		claimKeys(c)
		onLedger(c, func(lc *ledgerd.Config) {
			lc.WrapApplier = func(a ledgerstream.Applier) ledgerstream.Applier { return trustCommandClient{a.(*postgres.Store)} }
		})
	}

	// Scenario 1, the refunds' key.
	if b.RefundKeyedByParent {
		wrapConsumeLog(c, func(l postgres.ConsumeLog) postgres.ConsumeLog { return refundByParent{l} })
	}

	// Scenario 10, the expiry's clock.
	if b.ExpiryClockBehind {
		onLedger(c, func(lc *ledgerd.Config) { lc.Now = func() time.Time { return time.Now().Add(-time.Hour) } })
	}

	// Scenario 16.
	if b.UncheckedForwards {
		onAPI(c, func(ac *apid.Config) {
			inner := ac.WrapForwardReader
			ac.WrapForwardReader = func(r api.ForwardReader) api.ForwardReader {
				if inner != nil {
					r = inner(r)
				}
				return uncheckedForwards{r}
			}
		})
	}

	// Scenario 17.
	if b.IgnoreRevocation {
		wrapAPIStore(c, func(s api.Store) api.Store { return revocationBlind{Store: s, seen: &sync.Map{}} })
	}
}
