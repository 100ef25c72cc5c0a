package dlq_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// scrape returns the samples of name on url, keyed by their reason label.
func scrape(t *testing.T, url, name string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := map[string]float64{}
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		labels, value, _ := strings.Cut(line[len(name):], " ")
		if !strings.Contains(labels, `region="eu"`) {
			t.Errorf("%s: no region label", line)
		}
		_, reason, _ := strings.Cut(labels, `reason="`)
		reason, _, _ = strings.Cut(reason, `"`)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		got[reason] = v
	}
	return got
}

// TestCensus: paymesh_dlq_depth and paymesh_dlq_oldest_seconds count the
// dead letters the ledger wrote, by reason, and go down as an operator
// discards them, from the middle of the stream and from its head; a
// region whose stream cannot be read shows neither.
func TestCensus(t *testing.T) {
	ctx := context.Background()
	r := mustRegion(t)
	js, topo, f, ops := r.js, r.topo, r.f, r.ops
	census := dlq.NewCensus(js, "eu")
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := ledgerd.ObserveDeadLetters(m, "eu", census); err != nil {
		t.Fatal(err)
	}
	us := dlq.NewCensus(js, "us")
	if err := ledgerd.ObserveDeadLetters(m, "us", us); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	refresh := func() (depth, oldest map[string]float64) {
		t.Helper()
		if err := census.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		return scrape(t, srv.URL, "paymesh_dlq_depth"), scrape(t, srv.URL, "paymesh_dlq_oldest_seconds")
	}
	if depth, oldest := refresh(); len(depth) != 0 || len(oldest) != 0 {
		t.Fatalf("no dead letters: got depth %v, oldest %v, want no series", depth, oldest)
	}

	pub := r.pub
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	stop := worker(t, js, failing{}, topo, f)
	if _, err := pub.Publish(ctx, f.Transfer(t, a, b, 10)); err != nil {
		t.Fatal(err)
	}
	waitLetters(t, ops, 1)
	stop()
	worker(t, js, f.Store, topo, f)
	for range 2 {
		if _, err := pub.Publish(ctx, f.Transfer(t, a, f.ID(t), 5)); err != nil { // unknown destination
			t.Fatal(err)
		}
	}
	letters := waitLetters(t, ops, 3)
	notFound := string(ledger.CodeAccountNotFound)
	depth, oldest := refresh()
	if want := map[string]float64{ledgerstream.ReasonMaxDeliveries: 1, notFound: 2}; !equal(depth, want) {
		t.Fatalf("depth: got %v, want %v", depth, want)
	}
	if age := time.Since(letters[1].At).Seconds(); len(oldest) != 2 || oldest[notFound] < age-1 || oldest[notFound] > age+5 {
		t.Fatalf("oldest: got %v, want 2 reasons, %s about %.1fs", oldest, notFound, age)
	}

	// Discarded from the middle, then from the head.
	if _, err := ops.Discard(ctx, letters[1].Seq, "alice", "customer closed the account"); err != nil {
		t.Fatal(err)
	}
	depth, oldest = refresh()
	if want := map[string]float64{ledgerstream.ReasonMaxDeliveries: 1, notFound: 1}; !equal(depth, want) {
		t.Fatalf("depth after a discard: got %v, want %v", depth, want)
	}
	if age := time.Since(letters[2].At).Seconds(); oldest[notFound] > age+5 {
		t.Fatalf("oldest %s after a discard: got %v, want about %.1fs", notFound, oldest[notFound], age)
	}
	if _, err := ops.Discard(ctx, letters[0].Seq, "alice", "paid by hand"); err != nil {
		t.Fatal(err)
	}
	depth, oldest = refresh()
	if want := map[string]float64{ledgerstream.ReasonMaxDeliveries: 0, notFound: 1}; !equal(depth, want) {
		t.Fatalf("depth after the head's discard: got %v, want %v", depth, want)
	}
	if _, ok := oldest[ledgerstream.ReasonMaxDeliveries]; ok || len(oldest) != 1 {
		t.Fatalf("oldest after the head's discard: got %v, want %s only", oldest, notFound)
	}

	// The ledger of eu cannot read us's stream: its census fails and
	// shows nothing.
	if err := us.Refresh(ctx); err == nil {
		t.Fatal("census of a missing stream: no error")
	}
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		if strings.Contains(sc.Text(), `region="us"`) {
			t.Fatalf("a census that cannot read its stream shows %s", sc.Text())
		}
	}
}

func equal(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// BenchmarkCensusRefresh: the census of a deep dead-letter stream (5000
// dead letters): building it (one read per dead letter, once), then a
// refresh with nothing new (one stream info), and a scrape's read.
func BenchmarkCensusRefresh(b *testing.B) {
	ctx := context.Background()
	nt := natsembed.MustStartTopology(b, "eu")
	js := connect(b, nt, natsauth.Ledger)
	topo := ledgerstream.Topology{Region: "eu", Shards: 4, DuplicateWindow: time.Second}
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		b.Fatal(err)
	}
	const n = 5000
	for i := range n {
		m := nats.NewMsg(topo.DLQSubject())
		m.Header.Set(ledgerstream.HeaderDLQReason, []string{ledgerstream.ReasonMaxDeliveries, string(ledger.CodeAccountNotFound)}[i%2])
		m.Data = make([]byte, 200)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	census := dlq.NewCensus(js, "eu")
	start := time.Now()
	if err := census.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("first refresh of %d dead letters: %v", n, time.Since(start))
	b.Run("Unchanged", func(b *testing.B) {
		for b.Loop() {
			if err := census.Refresh(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Depths", func(b *testing.B) {
		for b.Loop() {
			if ds, ok := census.Depths(); !ok || len(ds) != 2 {
				b.Fatalf("depths: %v %v", ds, ok)
			}
		}
	})
}
