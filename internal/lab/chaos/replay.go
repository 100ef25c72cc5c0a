package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// replayBatch is how many replayed commands go into one Apply.
const replayBatch = 256

// checkReplay is I6: every region's ledger stream, which keepHistory kept
// whole since the cluster started, is read again from its first message by
// an ordered (ephemeral) consumer, and each command is
// applied again, in batches, on the region's database through a store of
// its own whose consume-log has no recent-commit cache, so the table and
// the business keys answer. The transfers, postings, credits and outbox
// rows must stay as they were, and every result must be a duplicate (or
// the conflict the first delivery was answered with).
func checkReplay(ctx context.Context, c *cluster.Cluster) (Check, error) {
	chk := newCheck(I6)
	for _, n := range sortedNames(c) {
		r := c.Region(n)
		before, err := counts(ctx, r.Ledger.Store)
		if err != nil {
			return chk, err
		}
		known, err := transferIDs(ctx, r.Ledger.Store)
		if err != nil {
			return chk, err
		}
		gen, err := idgen.NewGenerator(c.IDs(), n, 901)
		if err != nil {
			return chk, err
		}
		store := postgres.New(r.Ledger.Store.Pool(), postgres.Config{Region: n, IDs: gen, Regions: c.IDs(),
			Dedup: postgres.NewConsumeLog(dedup.New(dedup.Config{Holder: "chaos-replay/" + n})), Answers: apidb.Answers{}})
		cmds, err := readStreamRetrying(ctx, r.Ledger.JetStream(), r.Ledger.Topo.Stream(), c.IDs())
		if err != nil {
			return chk, fmt.Errorf("read %s: %w", r.Ledger.Topo.Stream(), err)
		}
		for start := 0; start < len(cmds); start += replayBatch {
			batch := cmds[start:min(start+replayBatch, len(cmds))]
			var valid []ledger.Command
			for _, cmd := range batch {
				if cmd.Validate(n, c.IDs(), time.Now()) == nil {
					valid = append(valid, cmd)
				}
			}
			results, err := store.Apply(ctx, valid)
			if err != nil {
				return chk, fmt.Errorf("replay %s: %w", n, err)
			}
			for i, res := range results {
				chk.Checked++
				if res.Kind != ledger.Duplicate && res.Kind != ledger.Conflict {
					chk.fail("%s: replayed %s (transfer %s) was %s, not a duplicate", n, valid[i].MsgKey(), valid[i].TransferID, res.Kind)
				}
			}
		}
		after, err := counts(ctx, r.Ledger.Store)
		if err != nil {
			return chk, err
		}
		if after != before {
			chk.fail("%s: replaying %d commands changed transfers/postings/credits/outbox from %v to %v; transfers added: %s",
				n, len(cmds), before, after, addedTransfers(ctx, r.Ledger.Store, known))
		}
	}
	return chk, nil
}

// historyDurable is the durable consumer that keeps a region's ledger
// stream whole for I6.
const historyDurable = "chaos-history"

// keepHistory makes every region's ledger stream keep all it is sent, for
// I6 to replay: the stream drops a command once every durable consumer that
// wants it acked it (interest retention), and this one, on every subject,
// is never read. Backlog counts only the ledger's shard consumers, so it
// does not hold up quiescence.
func keepHistory(ctx context.Context, c *cluster.Cluster) error {
	for _, n := range sortedNames(c) {
		r := c.Region(n)
		_, err := r.Ledger.JetStream().CreateOrUpdateConsumer(ctx, r.Ledger.Topo.Stream(),
			jetstream.ConsumerConfig{Durable: historyDurable, AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			return fmt.Errorf("history of %s: %w", r.Ledger.Topo.Stream(), err)
		}
	}
	return nil
}

// transferIDs returns the IDs of the transfers s holds.
func transferIDs(ctx context.Context, s *postgres.Store) ([]string, error) {
	rows, err := s.Pool().Query(ctx, `SELECT id FROM transfers`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// addedTransfers describes the transfers s holds that are not among
// known, so that a failed I6 names what appeared (and whether a replayed
// command or a late writer made it).
func addedTransfers(ctx context.Context, s *postgres.Store, known []string) string {
	rows, err := s.Pool().Query(ctx, `SELECT id || ' ' || type || ' ' || status || ' key ' || coalesce(idempotency_key, '-') ||
		' created ' || created_at::text FROM transfers WHERE NOT (id = ANY($1::text[])) ORDER BY id`, known)
	if err != nil {
		return err.Error()
	}
	added, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	if len(added) == 0 {
		return "none"
	}
	return strings.Join(added, "; ")
}

func counts(ctx context.Context, s *postgres.Store) ([4]int64, error) {
	var n [4]int64
	err := s.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM transfers), (SELECT count(*) FROM postings),
		(SELECT count(*) FROM credits), (SELECT count(*) FROM outbox)`).Scan(&n[0], &n[1], &n[2], &n[3])
	return n, err
}

// readStreamRetrying is readStream, tried again for up to 10 seconds while
// JetStream answers with no responders: a clustered region's stream may
// still be electing a leader after the R3 scenarios' faults.
func readStreamRetrying(ctx context.Context, js jetstream.JetStream, name string, ids *idgen.Regions) ([]ledger.Command, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		cmds, err := readStream(ctx, js, name, ids)
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return cmds, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readStream reads every command a stream holds, from its first message,
// one by one by sequence: an interest stream of three replicas takes no
// ordered consumer (its consumers must have its replicas). A message that
// does not decode, or came on a subject its kind never travels on, is
// skipped: the ledger dead-lettered it when it arrived.
func readStream(ctx context.Context, js jetstream.JetStream, name string, ids *idgen.Regions) ([]ledger.Command, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []ledger.Command
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // consumed before keepHistory's consumer existed
		}
		if err != nil {
			return nil, fmt.Errorf("replay %s: sequence %d: %w", name, seq, err)
		}
		if cmd, err := ledger.DecodeCommand(m.Data); err == nil && ledgerstream.CheckClass(m.Subject, cmd, ids) == nil {
			out = append(out, cmd)
		}
	}
	return out, nil
}
