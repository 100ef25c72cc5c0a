package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// Depth is how many dead letters of one reason a region holds and when the
// oldest of them was dead-lettered (zero when it holds none).
type Depth struct {
	Reason string
	Count  int64
	Oldest time.Time
}

// Census counts a region's dead letters by reason, for the metrics
// paymesh_dlq_depth and paymesh_dlq_oldest_seconds. The reason is a
// header, not a subject token, so the server cannot count by it; instead
// the census keeps a small index of DLQ_<R> (sequence, time and reason of
// each dead letter, about 32 bytes each) and Refresh brings it up to date
// incrementally: one stream info when nothing changed, one read per new
// dead letter, and one info with the deleted sequences when some were
// deleted (discarded or replayed). A scrape reads the index (Depths) and
// makes no round trip, however deep the stream.
type Census struct {
	js     jetstream.JetStream
	region string

	refreshing sync.Mutex // one Refresh at a time
	mu         sync.Mutex
	letters    []indexed // by sequence
	next       uint64    // the next sequence to read
	reasons    map[string]string
	depths     []Depth
	ok         bool // the last refresh succeeded
}

type indexed struct {
	seq    uint64
	at     time.Time
	reason string
}

// NewCensus returns the census of region's dead letters, read over js (the
// region's JetStream). It is empty until the first Refresh.
func NewCensus(js jetstream.JetStream, region string) *Census {
	return &Census{js: js, region: region, next: 1, reasons: map[string]string{}}
}

// Depths returns the dead letters by reason, sorted by reason, as of the
// last Refresh, and whether that refresh succeeded (a census that cannot
// read its stream has no current numbers). A reason whose dead letters
// are all gone stays with a count of 0.
func (c *Census) Depths() ([]Depth, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.depths), c.ok
}

// Refresh brings the census up to date with DLQ_<R>. It returns an error
// when the stream cannot be read; Depths then reports no numbers until a
// refresh succeeds.
func (c *Census) Refresh(ctx context.Context) error {
	c.refreshing.Lock()
	defer c.refreshing.Unlock()
	err := c.refresh(ctx)
	c.mu.Lock()
	c.ok = err == nil
	c.mu.Unlock()
	return err
}

func (c *Census) refresh(ctx context.Context) error {
	name := subjects.DLQStream(c.region)
	s, err := c.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("dlq census: stream %s: %w", name, err)
	}
	st := s.CachedInfo().State // js.Stream just read it: one round trip
	// Only the refresh (one at a time) writes letters and next.
	letters, next := c.letters, c.next
	if st.LastSeq+1 < next { // the stream was deleted and made again
		letters, next = nil, 1
	}
	changed := false
	for seq := max(next, st.FirstSeq); seq <= st.LastSeq; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subjects.DLQ(c.region)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("dlq census: read %s from %d: %w", name, seq, err)
		}
		if m.Sequence > st.LastSeq { // newer than info: the next refresh counts it
			break
		}
		letters = append(letters, indexed{seq: m.Sequence, at: m.Time, reason: c.intern(m.Header.Get(ledgerstream.HeaderDLQReason))})
		seq, changed = m.Sequence+1, true
	}
	next = max(next, st.LastSeq+1)
	// Dead letters deleted from the head (purged, or the oldest
	// discarded), then from the middle.
	if i := sort.Search(len(letters), func(i int) bool { return letters[i].seq >= st.FirstSeq }); i > 0 {
		letters, changed = letters[i:], true
	}
	if uint64(len(letters)) > st.Msgs {
		info, err := s.Info(ctx, jetstream.WithDeletedDetails(true))
		if err != nil {
			return fmt.Errorf("dlq census: deleted messages of %s: %w", name, err)
		}
		gone := make(map[uint64]bool, len(info.State.Deleted))
		for _, seq := range info.State.Deleted {
			gone[seq] = true
		}
		letters = slices.DeleteFunc(letters, func(l indexed) bool { return gone[l.seq] || l.seq < info.State.FirstSeq })
		changed = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.letters, c.next = letters, next
	if changed || c.depths == nil {
		c.depths = c.count()
	}
	return nil
}

// count aggregates the index by reason; a reason seen before and now empty
// stays, with a count of 0.
func (c *Census) count() []Depth {
	by := make(map[string]*Depth, len(c.reasons))
	for r := range c.reasons {
		by[r] = &Depth{Reason: r}
	}
	for _, l := range c.letters {
		d := by[l.reason]
		d.Count++
		if d.Oldest.IsZero() || l.at.Before(d.Oldest) {
			d.Oldest = l.at
		}
	}
	out := make([]Depth, 0, len(by))
	for _, d := range by {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b Depth) int {
		if a.Reason < b.Reason {
			return -1
		}
		if a.Reason > b.Reason {
			return 1
		}
		return 0
	})
	return out
}

// intern returns one copy of each reason, so that the index does not hold
// a string per dead letter.
func (c *Census) intern(reason string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.reasons[reason]; ok {
		return r
	}
	c.reasons[reason] = reason
	return reason
}

// Run refreshes the census every interval until ctx ends, logging a
// failed refresh once until one succeeds again.
func (c *Census) Run(ctx context.Context, every time.Duration, log *slog.Logger) {
	failing := false
	for t := time.NewTicker(every); ; {
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
			if !failing {
				log.Warn("dead-letter census: refresh failed", "region", c.region, "err", err)
			}
			failing = true
		} else {
			failing = false
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
