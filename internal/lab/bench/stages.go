package bench

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// The instants a message passes on its way from the publisher to its ack,
// in order: each stage of the breakdown runs from one to the next.
const (
	atPublished  = iota // the publisher's PublishMsgAsync (tracker.published)
	atStored            // the stream stored it (its metadata's timestamp)
	atDelivered         // the ledger's consumer handed it over (Consume's callback)
	atFormed            // its batch was taken from the inbox
	atApplying          // decoded and validated, the batch went to the store
	atBegan             // the store began the transaction
	atCommitting        // the statements done, COMMIT sent
	atCommitted         // COMMIT answered
	atAcked             // acked (tracker.committed)
	instants
)

// stageNames name the stage that ends at each instant after the first.
var stageNames = [instants]string{
	atStored:     "publish → stored (client, stream write)",
	atDelivered:  "stored → delivered (stream wait, pull)",
	atFormed:     "delivered → batch (inbox wait)",
	atApplying:   "batch → apply (decode, validate, spans)",
	atBegan:      "apply → BEGIN (keys, recent-commit cache)",
	atCommitting: "statements",
	atCommitted:  "COMMIT (WAL flush)",
	atAcked:      "COMMIT → ack (results, acks)",
}

// Stage is one stage of the publish→commit latency: its own duration's
// percentiles over the phase's messages, and its mean over the slowest 1 %
// of them (by publish→ack), which tells where the tail comes from. The
// stages' p50s and p99s do not add up; their tail means do.
type Stage struct {
	Name     string  `json:"name"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	TailMs   float64 `json:"slowest_1pct_mean_ms"`
	MeanMs   float64 `json:"mean_ms"`
	Messages int     `json:"messages"`
}

// stamps holds, for each of a phase's messages, the instants between its
// publish and its ack (Unix ns, 0 until seen), and its PubAck.
type stamps struct {
	at     [instants][]int64
	pubAck []int64
	size   []int32 // the size of the batch that applied it
}

func newStamps(n int) *stamps {
	s := &stamps{pubAck: make([]int64, n), size: make([]int32, n)}
	for i := atStored; i < atAcked; i++ {
		s.at[i] = make([]int64, n)
	}
	return s
}

func (s *stamps) set(which, i int, ns int64) { atomic.StoreInt64(&s.at[which][i], ns) }

// batch records a committed batch's instants for each of its messages.
func (t *tracker) batch(b ledgerstream.Batch) {
	s := t.stamps
	for _, m := range b.Msgs {
		i, ok := t.index(m.Headers().Get(jetstream.MsgIDHeader))
		if !ok {
			continue
		}
		if md, err := m.Metadata(); err == nil {
			s.set(atStored, i, md.Timestamp.UnixNano())
		}
		atomic.StoreInt32(&s.size[i], int32(len(b.Msgs)))
		s.set(atFormed, i, b.Formed.UnixNano())
		s.set(atApplying, i, b.Applying.UnixNano())
		if !b.Tx.Committed.IsZero() {
			s.set(atBegan, i, b.Tx.Began.UnixNano())
			s.set(atCommitting, i, b.Tx.Committing.UnixNano())
			s.set(atCommitted, i, b.Tx.Committed.UnixNano())
		}
	}
}

// delivered records when the consumer was handed the message.
func (t *tracker) delivered(msgID string, now int64) {
	if i, ok := t.index(msgID); ok {
		t.stamps.set(atDelivered, i, now)
	}
}

// pubAcked records when the publisher saw the message's PubAck.
func (t *tracker) pubAcked(msgID string, now int64) {
	if i, ok := t.index(msgID); ok {
		atomic.StoreInt64(&t.stamps.pubAck[i], now)
	}
}

// stages breaks the publish→ack latency of the first sent messages down by
// stage, over the messages every instant of which was seen (a batch the
// recent-commit cache settled ran no transaction), and adds the
// publish→PubAck time, which the publisher waits for beside the path.
func (t *tracker) stages(sent int) ([]Stage, BatchFill) {
	s := t.stamps
	s.at[atPublished], s.at[atAcked] = t.published, t.committed
	var whole []int
	for i := range sent {
		complete := true
		for at := range instants {
			if s.at[at][i] == 0 {
				complete = false
				break
			}
		}
		if complete {
			whole = append(whole, i)
		}
	}
	if len(whole) == 0 {
		return nil, BatchFill{}
	}
	// Each stage's duration per message, and the total publish→ack last.
	var names []string
	var series [][]time.Duration
	add := func(name string, from, to []int64) {
		d := make([]time.Duration, len(whole))
		for j, i := range whole {
			d[j] = time.Duration(to[i] - from[i])
		}
		names, series = append(names, name), append(series, d)
	}
	for at := atStored; at < instants; at++ {
		add(stageNames[at], s.at[at-1], s.at[at])
	}
	add("total publish → ack", s.at[atPublished], s.at[atAcked])
	total := series[len(series)-1]
	if !slices.ContainsFunc(whole, func(i int) bool { return s.pubAck[i] == 0 }) {
		add("beside: publish → PubAck seen", s.at[atPublished], s.pubAck)
	}
	out := stagesOf(names, series, total)
	slowest := slowestOf(total)
	sizes := make([]int32, len(whole))
	var tail int64
	for j, i := range whole {
		sizes[j] = s.size[i]
	}
	for _, j := range slowest {
		tail += int64(sizes[j])
	}
	slices.Sort(sizes)
	fill := BatchFill{P50: int(sizes[len(sizes)/2]), P99: int(sizes[int(0.99*float64(len(sizes)-1)+0.5)]),
		Slowest: float64(tail) / float64(len(slowest))}
	return out, fill
}

// BatchFill is the size of the batches a phase's messages were applied in,
// per message: median, p99, and the mean over the slowest 1 %.
type BatchFill struct {
	P50     int     `json:"p50"`
	P99     int     `json:"p99"`
	Slowest float64 `json:"slowest_1pct_mean"`
}

// stagesOf returns, for each named series of durations (one per item), its
// p50, p99, mean and mean over the items whose total is among the slowest
// 1 %.
func stagesOf(names []string, series [][]time.Duration, total []time.Duration) []Stage {
	slowest := slowestOf(total)
	var out []Stage
	for k, d := range series {
		var sum, tail time.Duration
		for _, x := range d {
			sum += x
		}
		for _, i := range slowest {
			tail += d[i]
		}
		sorted := slices.Clone(d)
		slices.Sort(sorted)
		out = append(out, Stage{Name: names[k], P50Ms: ms(percentile(sorted, 0.5)), P99Ms: ms(percentile(sorted, 0.99)),
			MeanMs: ms(sum / time.Duration(max(len(d), 1))), TailMs: ms(tail / time.Duration(len(slowest))), Messages: len(d)})
	}
	return out
}

// slowestOf returns the indexes of the slowest 1 % of total (at least one).
func slowestOf(total []time.Duration) []int {
	order := make([]int, len(total))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(total[b] - total[a]) })
	return order[:max(1, len(order)/100)]
}
