package ledger_test

import (
	"testing"

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
	st.Record(ledger.TopicCredit, ledger.Result{Kind: ledger.Duplicate, Layer: "state_cas"})
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
	dups := st.DuplicatesByTopic()
	if dups[ledger.LayerTopic{Layer: "dedup_table", Topic: ledger.TopicCredit}] != 1 ||
		dups[ledger.LayerTopic{Layer: "state_cas", Topic: ledger.TopicCredit}] != 1 ||
		dups[ledger.LayerTopic{Layer: "dedup_table", Topic: ledger.TopicTransfer}] != 1 {
		t.Errorf("duplicates by layer and topic: got %v", dups)
	}
	if got := st.Applied.Load(); got != 1 {
		t.Errorf("applied: got %d, want 1", got)
	}
}
