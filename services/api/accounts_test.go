package api_test

import (
	"slices"
	"testing"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestEntriesPage: a page holds up to its limit of the rows read (one more
// than the limit, to tell a next page), and a limit below 1, which the
// edge and the forwarded-call check refuse, still makes a page of one row,
// never an index before the first (limit 0 killed the process).
func TestEntriesPage(t *testing.T) {
	ps := []ledger.Posting{{AccountVersion: 1}, {AccountVersion: 2}, {AccountVersion: 3}}
	tests := []struct {
		name     string
		rows     []ledger.Posting
		limit    int
		versions []int64
		next     int64 // 0: no next page
	}{
		{"LastPage", ps[:2], 2, []int64{1, 2}, 0},
		{"MorePages", ps, 2, []int64{1, 2}, 2},
		{"NoRows", nil, 50, []int64{}, 0},
		{"LimitZero", ps[:1], 0, []int64{1}, 0},
		{"LimitZeroMore", ps, 0, []int64{1}, 1},
		{"LimitNegative", ps, -1, []int64{1}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page := api.EntriesPage(tt.rows, tt.limit)
			got := []int64{}
			for _, e := range page.Entries {
				got = append(got, e.Version)
			}
			var next int64
			if page.NextAfter != nil {
				next = *page.NextAfter
			}
			if !slices.Equal(got, tt.versions) || next != tt.next {
				t.Fatalf("got versions %v next %d, want %v next %d", got, next, tt.versions, tt.next)
			}
		})
	}
}
