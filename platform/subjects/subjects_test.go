package subjects_test

import (
	"strings"
	"testing"

	"github.com/paymesh/paymesh/platform/subjects"
)

func TestLedgerOfRoute(t *testing.T) {
	if got, err := subjects.LedgerOfRoute(subjects.RouteShard("eu", "us", 3)); err != nil || got != subjects.LedgerShard("us", 3) {
		t.Fatalf("got %q %v, want %s", got, err, subjects.LedgerShard("us", 3))
	}
	for _, bad := range []string{"route.eu.us", "ledger.eu.us.3", "route.eu.us.3.4", ""} {
		if _, err := subjects.LedgerOfRoute(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// TestWildcards: every concrete subject falls under its region's wildcard,
// and the all-regions wildcards cover every region's.
func TestWildcards(t *testing.T) {
	under := func(subject, wildcard string) bool {
		return strings.HasPrefix(subject, strings.TrimSuffix(strings.TrimSuffix(wildcard, ">"), "*"))
	}
	for _, c := range []struct{ subject, wildcard string }{
		{subjects.LedgerShard("eu", 2), subjects.Ledger("eu")},
		{subjects.Ledger("eu"), subjects.AllLedgers},
		{subjects.RouteShard("eu", "us", 1), subjects.RouteHome("eu", "us")},
		{subjects.RouteHome("eu", "us"), subjects.Route("eu")},
		{subjects.API("ap"), subjects.AllAPIs},
		{subjects.Answers("eu", "3"), subjects.AnswersOf("eu")},
	} {
		if !under(c.subject, c.wildcard) {
			t.Errorf("%s is not under %s", c.subject, c.wildcard)
		}
	}
	if under(subjects.Answers("us", "3"), subjects.AnswersOf("eu")) {
		t.Errorf("us's answers subject is under eu's wildcard")
	}
	if under(subjects.LedgerShard("us", 2), subjects.Ledger("eu")) {
		t.Errorf("us's ledger subject is under eu's wildcard")
	}
}
