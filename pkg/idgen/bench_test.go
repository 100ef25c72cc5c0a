package idgen

import "testing"

// BenchmarkNextString mints IDs in text form, as the ledger does for every
// account and the API for every transfer. A generator mints at most 256
// IDs per 10 ms tick, then sleeps: past 25,600 IDs a second per node this
// measures the tick, not the code.
func BenchmarkNextString(b *testing.B) {
	g, err := NewGenerator(testRegions(b), "eu", 1)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := g.NextString(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFormat is the text encoding alone.
func BenchmarkFormat(b *testing.B) {
	r := testRegions(b)
	id := makeID(1<<38, 7, 1, 5)
	for b.Loop() {
		if _, err := r.Format(id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHomeRegion parses an ID's home region, which every command's
// validation does for its transfer and both accounts.
func BenchmarkHomeRegion(b *testing.B) {
	r := testRegions(b)
	s := r.MustFormat(makeID(1<<38, 7, 2, 5))
	for b.Loop() {
		if _, err := r.HomeRegion(s); err != nil {
			b.Fatal(err)
		}
	}
}
