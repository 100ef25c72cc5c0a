package subjects_test

import (
	"strings"
	"testing"

	"github.com/paymesh/paymesh/platform/subjects"
)

func TestLedgerOfRoute(t *testing.T) {
	want := subjects.LedgerSubject("us", 3, subjects.ClassCommand, "eu")
	if got, err := subjects.LedgerOfRoute(subjects.RouteShard("eu", "us", 3)); err != nil || got != want {
		t.Fatalf("got %q %v, want %s", got, err, want)
	}
	for _, bad := range []string{"route.eu.us", "ledger.eu.us.3", "route.eu.us.3.4", "route.eu.us.x", "route.eu.us.-1", ""} {
		if _, err := subjects.LedgerOfRoute(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// TestParseLedger reads back what LedgerSubject writes, and refuses every
// other shape, an unknown class and a bad shard.
func TestParseLedger(t *testing.T) {
	for _, c := range subjects.Classes {
		s := subjects.LedgerSubject("eu", 7, c, "us")
		got, err := subjects.ParseLedger(s)
		if want := (subjects.LedgerAddress{Region: "eu", Shard: 7, Class: c, From: "us"}); err != nil || got != want {
			t.Errorf("%s: got %+v %v, want %+v", s, got, err, want)
		}
	}
	for _, bad := range []string{"", "ledger.eu.3", "ledger.eu.3.cmd", "ledger.eu.3.cmd.us.x", "ledger.eu.x.cmd.us",
		"ledger.eu.-1.cmd.us", "ledger.eu.3.fund.us", "ledger..3.cmd.us", "ledger.eu.3.cmd.", "route.eu.3.cmd.us"} {
		if a, err := subjects.ParseLedger(bad); err == nil {
			t.Errorf("%q: got %+v, want an error", bad, a)
		}
	}
}

func TestWildcards(t *testing.T) {
	under := func(subject, wildcard string) bool {
		return strings.HasPrefix(subject, strings.TrimSuffix(strings.TrimSuffix(wildcard, ">"), "*"))
	}
	for _, c := range []struct{ subject, wildcard string }{
		{subjects.LedgerShard("eu", 2), subjects.Ledger("eu")},
		{subjects.LedgerSubject("eu", 2, subjects.ClassStep, "us"), subjects.LedgerShard("eu", 2)},
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
