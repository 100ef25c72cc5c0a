// Package ledgerstream is the ledger's JetStream adapter: the region's ledger
// and dead-letter streams, a publisher that always uses the command's
// deterministic Nats-Msg-Id, and a batching pull consumer that acks only
// after the batch committed.
//
// Subjects of region <r>:
//
//	ledger.<r>.<shard>   transfer commands whose source account is homed in <r>;
//	                     shard = FNV-1a(source account) mod Shards, so one
//	                     account's commands stay in one subject, in order
//	dlq.<r>.ledger       dead letters: commands that can never apply, with
//	                     the reason in headers
package ledgerstream

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
)

// Topology names a region's ledger streams and subjects.
type Topology struct {
	Region string
	// Shards is how many ledger subjects the region's accounts spread over.
	Shards int
	// DuplicateWindow is the JetStream Nats-Msg-Id window (dedup layer 2).
	DuplicateWindow time.Duration
	// Limits bounds the ledger stream's size (zero fields: DefaultLimits).
	// Commands stay until every shard's consumer has acked them, however
	// long that takes: there is no age limit. A full stream refuses
	// publishes.
	Limits Limits
	// DLQLimits bounds the dead-letter stream's size (zero fields:
	// DefaultDLQLimits). A full one refuses dead letters, and the worker
	// leaves their messages in the ledger stream.
	DLQLimits Limits
	// Replicas is how many servers of the region's JetStream cluster keep
	// each stream (0 means 1; at most MaxReplicas). EnsureStreams sets it
	// on an existing stream too, so a stream scales up or down with it.
	Replicas int
}

// Defaults for a Topology's zero fields.
const (
	DefaultShards          = 16
	DefaultDuplicateWindow = 2 * time.Minute
	// MaxReplicas is the most replicas JetStream keeps of a stream.
	MaxReplicas = 5
)

// CheckReplicas returns an error unless n is a stream replica count
// JetStream accepts, 1 to MaxReplicas. Callers that take 0 to mean 1 map it
// first.
func CheckReplicas(n int) error {
	if n < 1 || n > MaxReplicas {
		return fmt.Errorf("stream replicas %d: want 1 to %d (3 for a region cluster of three servers)", n, MaxReplicas)
	}
	return nil
}

// Window returns the ledger stream's Nats-Msg-Id window in force (its
// default when unset).
func (t Topology) Window() time.Duration { return t.withDefaults().DuplicateWindow }

func (t Topology) withDefaults() Topology {
	if t.Shards <= 0 {
		t.Shards = DefaultShards
	}
	if t.DuplicateWindow <= 0 {
		t.DuplicateWindow = DefaultDuplicateWindow
	}
	t.Limits = t.Limits.Or(DefaultLimits)
	t.DLQLimits = t.DLQLimits.Or(DefaultDLQLimits)
	if t.Replicas == 0 {
		t.Replicas = 1
	}
	return t
}

// Stream is the region's ledger stream name.
func (t Topology) Stream() string { return subjects.LedgerStream(t.Region) }

// DLQStream is the region's dead-letter stream name.
func (t Topology) DLQStream() string { return subjects.DLQStream(t.Region) }

// DLQSubject is where the region's dead letters go.
func (t Topology) DLQSubject() string { return subjects.DLQ(t.Region) }

// Subjects is the wildcard of every ledger subject of the region.
func (t Topology) Subjects() string { return subjects.Ledger(t.Region) }

// Shard is the shard of an account: FNV-1a of its ID modulo Shards.
func (t Topology) Shard(accountID string) int {
	t = t.withDefaults()
	h := fnv.New32a()
	h.Write([]byte(accountID))
	return int(h.Sum32() % uint32(t.Shards))
}

// Subject is the ledger subject of an account's shard for class, sent
// from region from.
func (t Topology) Subject(accountID string, class subjects.Class, from string) string {
	return subjects.LedgerSubject(t.Region, t.Shard(accountID), class, from)
}

// CommandSubject is the subject cmd travels on to this region's ledger,
// sent from region from: its account's shard (ledger.Command.Account) and
// its kind's class (ClassOf).
func (t Topology) CommandSubject(cmd ledger.Command, from string) string {
	return t.Subject(cmd.Account(), ClassOf(cmd), from)
}

// ShardSubjects is the wildcard of a shard's subjects: every class, from
// anywhere (the shard consumer's filter).
func (t Topology) ShardSubjects(shard int) string { return subjects.LedgerShard(t.Region, shard) }

// ShardDurable names the durable consumer of a shard.
func ShardDurable(shard int) string { return fmt.Sprintf("ledger-%d", shard) }

// AllShards lists every shard of the topology.
func AllShards(t Topology) []int {
	t = t.withDefaults()
	s := make([]int, t.Shards)
	for i := range s {
		s[i] = i
	}
	return s
}

// Split deals shards round-robin into n sets: set i holds the shards k with
// k mod n == i. Splitting by worker keeps each shard with one worker.
func Split(shards []int, n int) [][]int {
	sets := make([][]int, n)
	for j, k := range shards {
		sets[j%n] = append(sets[j%n], k)
	}
	return sets
}

// Backlog sums, over every shard's ledger consumer of the stream (other
// consumers do not count), the messages not yet delivered and those
// delivered but not acked. Zero means the ledger
// has applied everything published so far. A consumer's pending count
// catches up with a new message a moment after the stream stored it, so a
// consumer that has not yet delivered its subject's last message counts
// as one more.
func Backlog(ctx context.Context, js jetstream.JetStream, t Topology) (uint64, error) {
	s, err := js.Stream(ctx, t.Stream())
	if err != nil {
		return 0, err
	}
	var n uint64
	consumers := 0
	infos := s.ListConsumers(ctx)
	var behind []*jetstream.ConsumerInfo
	shards := make(map[string]bool)
	for _, k := range AllShards(t) {
		shards[ShardDurable(k)] = true
	}
	for info := range infos.Info() {
		if !shards[info.Name] {
			continue // not a ledger's: an operator's or an audit's reader
		}
		n += info.NumPending + uint64(info.NumAckPending)
		consumers++
		if info.NumPending == 0 && info.Config.FilterSubject != "" {
			behind = append(behind, info)
		}
	}
	if err := infos.Err(); err != nil {
		return 0, err
	}
	for _, info := range behind {
		last, err := s.GetLastMsgForSubject(ctx, info.Config.FilterSubject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return 0, err
		case last.Sequence > info.Delivered.Stream:
			n++
		}
	}
	if consumers < t.withDefaults().Shards {
		// Some shard has no consumer yet: count the whole stream as pending.
		si, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		n += si.State.Msgs
	}
	return n, nil
}

// EnsureStreams creates or updates the region's ledger and dead-letter
// streams: file storage, t.Replicas replicas, no age limit, and a size
// bound (t.Limits, t.DLQLimits) at which a stream refuses publishes.
//
// The ledger stream keeps a command until the durable consumer of its shard
// acked or terminated it (interest retention). An interest stream drops at
// once a message that no consumer wants, so EnsureStreams creates every
// shard's durable consumer (ShardDurable) before the stream takes that
// retention: a new stream is created with limits retention first. The
// dead-letter stream keeps each dead letter until an operator replays or
// discards it (limits retention).
//
// It is idempotent. It updates an existing stream to this configuration
// (an age limit of an older version goes, and the stream's replica count
// becomes t.Replicas: JetStream adds or removes peers, and the stream's
// consumers follow). It returns an error for a replica count CheckReplicas
// refuses or limits CheckLimits refuses, and the first JetStream error
// (such as more replicas than the region has servers).
func EnsureStreams(ctx context.Context, js jetstream.JetStream, t Topology) error {
	t = t.withDefaults()
	err := CheckReplicas(t.Replicas)
	if err == nil {
		err = errors.Join(CheckLimits(t.Limits), CheckLimits(t.DLQLimits))
	}
	if err != nil {
		return fmt.Errorf("ensure streams of %s: %w", t.Region, err)
	}
	ledgerCfg := t.stream(t.Stream(), t.Subjects(), jetstream.InterestPolicy, t.Limits,
		"transfer commands for accounts homed in region "+t.Region+", kept until their shard's consumer acked them")
	if err := createWithLimits(ctx, js, ledgerCfg); err != nil {
		return err
	}
	if err := ensureShardConsumers(ctx, js, t); err != nil {
		return err
	}
	dlqCfg := t.stream(t.DLQStream(), t.DLQSubject(), jetstream.LimitsPolicy, t.DLQLimits,
		"dead-lettered ledger commands of region "+t.Region+", with the reason in headers")
	for _, cfg := range []jetstream.StreamConfig{ledgerCfg, dlqCfg} {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// stream is the configuration of one of the region's streams: file
// storage, t's Msg-Id window and replicas, bounded by l.
func (t Topology) stream(name, subject string, retention jetstream.RetentionPolicy, l Limits, description string) jetstream.StreamConfig {
	return l.Apply(jetstream.StreamConfig{Name: name, Description: description, Subjects: []string{subject},
		Storage: jetstream.FileStorage, Retention: retention, Duplicates: t.DuplicateWindow, Replicas: t.Replicas})
}

// createWithLimits creates the stream of cfg with limits retention when it
// does not exist yet, so that it keeps what is published before its
// consumers exist; an existing stream is left as it is.
func createWithLimits(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	_, err := js.Stream(ctx, cfg.Name)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		if err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
		return nil
	}
	cfg.Retention = jetstream.LimitsPolicy
	if _, err := js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
	}
	return nil
}

// ensureShardConsumers creates the durable consumer of every shard that has
// none, with the default consumer settings; a ledger's Consumer sets its own
// when it starts. An existing one is left as it is.
func ensureShardConsumers(ctx context.Context, js jetstream.JetStream, t Topology) error {
	for _, shard := range AllShards(t) {
		_, err := js.CreateConsumer(ctx, t.Stream(), shardConsumer(t, shard, DefaultAckWait, DefaultBatchSize))
		if err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return fmt.Errorf("ensure consumer %s of %s: %w", ShardDurable(shard), t.Stream(), err)
		}
	}
	return nil
}

// shardConsumer is the configuration of a shard's durable consumer.
func shardConsumer(t Topology, shard int, ackWait time.Duration, batch int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:   ShardDurable(shard),
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   ackWait,
		// JetStream never gives up on a message by itself: the worker
		// dead-letters it at MaxDeliver, so a worker that crashes on
		// the last attempt cannot make it vanish.
		MaxDeliver:    -1,
		FilterSubject: t.ShardSubjects(shard),
		MaxAckPending: 4 * batch,
	}
}
