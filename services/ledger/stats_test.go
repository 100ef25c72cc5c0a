package ledger_test

import (
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// TestCommandTopic: every command type has its own topic, and anything
// else is TopicUnknown.
func TestCommandTopic(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		want string
	}{
		{ledger.TypeTransfer, "transfer"},
		{ledger.TypeFund, "fund"},
		{ledger.TypeCredit, "credit"},
		{ledger.TypeConfirm, "confirm"},
		{ledger.TypeRefuse, "refund"},
		{"", "unknown"},
		{"payout", "unknown"},
	} {
		if got := (ledger.Command{Type: tc.typ}).Topic().String(); got != tc.want {
			t.Errorf("topic of %q: got %s, want %s", tc.typ, got, tc.want)
		}
	}
	if got := ledger.Topic(200).String(); got != "unknown" {
		t.Errorf("topic 200: got %s, want unknown", got)
	}
}

// TestStatsByTopic: deliveries and duplicates are counted by topic, the
// totals stay the sums, and duplicates by layer add up over topics.
func TestStatsByTopic(t *testing.T) {
	var st ledger.Stats
	for range 3 {
		st.Delivered(ledger.TopicTransfer)
	}
	st.Delivered(ledger.TopicCredit)
	st.Delivered(ledger.Topic(99)) // out of range: unknown
	st.Record(ledger.TopicTransfer, ledger.Result{Kind: ledger.Duplicate, Layer: "dedup_table"})
	st.Record(ledger.TopicCredit, ledger.Result{Kind: ledger.Duplicate, Layer: "dedup_table"})
	st.Caught(ledger.Caught{Topic: ledger.TopicCredit, Layer: "state_cas", Cause: ledger.CauseSagaResend})
	st.Record(ledger.TopicTransfer, ledger.Result{Kind: ledger.Applied})

	if got := st.Deliveries.Load(); got != 5 {
		t.Errorf("deliveries: got %d, want 5", got)
	}
	by := st.DeliveriesByTopic()
	if by[ledger.TopicTransfer] != 3 || by[ledger.TopicCredit] != 1 || by[ledger.TopicUnknown] != 1 || by[ledger.TopicRefund] != 0 {
		t.Errorf("deliveries by topic: got %v, want transfer 3, credit 1, unknown 1", by)
	}
	if got := st.Duplicates(); got["dedup_table"] != 2 || got["state_cas"] != 1 || len(got) != 2 {
		t.Errorf("duplicates by layer: got %v, want dedup_table 2, state_cas 1", got)
	}
	dups := st.DuplicatesByKey()
	if dups[ledger.DuplicateKey{Layer: "dedup_table", Topic: ledger.TopicCredit, Cause: ledger.CauseUnknown}] != 1 ||
		dups[ledger.DuplicateKey{Layer: "state_cas", Topic: ledger.TopicCredit, Cause: ledger.CauseSagaResend}] != 1 ||
		dups[ledger.DuplicateKey{Layer: "dedup_table", Topic: ledger.TopicTransfer, Cause: ledger.CauseUnknown}] != 1 {
		t.Errorf("duplicates by layer, topic and cause: got %v", dups)
	}
	if got := st.DuplicatesByCause(); got[ledger.CauseUnknown] != 2 || got[ledger.CauseSagaResend] != 1 || len(got) != 2 {
		t.Errorf("duplicates by cause: got %v, want unknown 2 (Record does not know), saga_resend 1", got)
	}
	if got := st.Applied.Load(); got != 1 {
		t.Errorf("applied: got %d, want 1", got)
	}
}

// TestCause: each arrival's duplicate is attributed to one cause, in the
// order the rules are written: a replay, a redelivery, a publisher that
// did not say its attempt, a saga step, a publish retried, else the client.
func TestCause(t *testing.T) {
	for _, tc := range []struct {
		a    ledger.Arrival
		want ledger.Cause
	}{
		{ledger.Arrival{Deliveries: 1, Attempt: 1}, ledger.CauseClientRetry},
		{ledger.Arrival{Deliveries: 1, Attempt: 2}, ledger.CauseRepublish},
		{ledger.Arrival{Deliveries: 2, Attempt: 1}, ledger.CauseRedelivery},
		{ledger.Arrival{Deliveries: 3, Attempt: 2, Step: true}, ledger.CauseRedelivery},
		{ledger.Arrival{Deliveries: 1, Attempt: 1, Step: true}, ledger.CauseSagaResend},
		{ledger.Arrival{Deliveries: 1, Attempt: 4, Step: true}, ledger.CauseSagaResend},
		{ledger.Arrival{Deliveries: 2, Attempt: 1, Replay: true}, ledger.CauseDLQReplay},
		{ledger.Arrival{Deliveries: 1}, ledger.CauseUnknown},
		{ledger.Arrival{Deliveries: 1, Step: true}, ledger.CauseUnknown},
	} {
		if got := tc.a.Cause(); got != tc.want {
			t.Errorf("%+v: got %s, want %s", tc.a, got, tc.want)
		}
	}
}

// TestAgeOf: a duplicate's age runs from its key's first effect when the
// layer recorded it, else from the request's creation, and is never
// negative.
func TestAgeOf(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	cmd := ledger.Command{CreatedAt: now.Add(-time.Hour)}
	for _, tc := range []struct {
		name string
		cmd  ledger.Command
		r    ledger.Result
		want time.Duration
	}{
		{"FirstEffect", cmd, ledger.Result{FirstAt: now.Add(-time.Minute)}, time.Minute},
		{"RequestCreated", cmd, ledger.Result{}, time.Hour},
		{"Future", ledger.Command{CreatedAt: now.Add(time.Second)}, ledger.Result{}, 0},
		{"NoTime", ledger.Command{}, ledger.Result{}, 0},
	} {
		if got := ledger.AgeOf(tc.cmd, tc.r, now); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
