package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/platform/natsconn"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// dlqCmd is paymesh dlq: a region's dead letters (services/ledger/dlq).
type dlqCmd struct {
	List    dlqListCmd    `cmd:"" help:"List a region's dead letters, oldest first."`
	Show    dlqShowCmd    `cmd:"" help:"Show one dead letter: payload, headers, reason, first and last delivery."`
	Replay  dlqReplayCmd  `cmd:"" help:"Replay dead letters to the region's ledger with their original keys and report what the ledger made of each."`
	Discard dlqDiscardCmd `cmd:"" help:"Discard a dead letter, recording who, when and why."`
}

// dlqConn is where the dead letters are: the region's nats-server (as the
// region's operator user, ops-<region>) and its database (the audit).
type dlqConn struct {
	regionDB
	NATSURL string `name:"nats-url" env:"PAYMESH_NATS_URL" default:"nats://127.0.0.1:4222" help:"NATS server of the region."`
	natsLogin
	Wait time.Duration `default:"30s" help:"How long a replay waits for the ledger's outcome."`
}

func (c dlqConn) open(ctx context.Context, t regions.Table, log *slog.Logger) (*dlq.Ops, func(), error) {
	reg, url, err := c.resolve(t)
	if err != nil {
		return nil, nil, err
	}
	pool, err := postgres.Connect(ctx, url, 10*time.Second, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := pgdb.Migrate(ctx, pool, dlq.Migrations()); err != nil {
		pool.Close()
		return nil, nil, err
	}
	nc, err := natsconn.Connect(ctx, natsconn.Config{URL: c.NATSURL, User: c.NATSUser, Password: c.NATSPassword, CAFile: c.NATSCA,
		Name: "paymesh-dlq-" + reg.Name, Timeout: 10 * time.Second, Log: log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		pool.Close()
		return nil, nil, err
	}
	return &dlq.Ops{Region: reg.Name, JS: js, Pool: pool, Wait: c.Wait}, func() { nc.Close(); pool.Close() }, nil
}

// dlqFilter selects dead letters.
type dlqFilter struct {
	Reason    string        `help:"Only dead letters of this reason (a ledger error code, or max_deliveries)."`
	OlderThan time.Duration `name:"older-than" help:"Only dead letters at least this old (e.g. 1h)."`
}

type dlqListCmd struct {
	dlqConn
	dlqFilter
	Limit int    `default:"50" help:"Dead letters per page (0: all)."`
	After uint64 `help:"Start after this sequence (the next page's --after is printed)."`
}

func (c *dlqListCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	ops, closeOps, err := c.open(ctx, t, log)
	if err != nil {
		return err
	}
	defer closeOps()
	p, err := ops.List(ctx, dlq.Filter{Reason: c.Reason, OlderThan: c.OlderThan, After: c.After, Limit: c.Limit})
	if err != nil {
		return err
	}
	fmt.Printf("%-6s %-20s %-10s %-18s %-5s %s\n", "SEQ", "DEAD-LETTERED", "AGE", "REASON", "DELIV", "KEY")
	for _, l := range p.Letters {
		key := l.Key()
		if key == "" {
			key = "(not a command)"
		}
		fmt.Printf("%-6d %-20s %-10s %-18s %-5d %s\n", l.Seq, l.At.UTC().Format(time.RFC3339), time.Since(l.At).Round(time.Second), l.Reason, l.Deliveries, key)
	}
	if p.Next != 0 {
		fmt.Printf("more: --after %d\n", p.Next)
	}
	return nil
}

type dlqShowCmd struct {
	dlqConn
	Seq uint64 `arg:"" help:"Sequence of the dead letter in DLQ_<REGION>."`
}

func (c *dlqShowCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	ops, closeOps, err := c.open(ctx, t, log)
	if err != nil {
		return err
	}
	defer closeOps()
	l, err := ops.Show(ctx, c.Seq)
	if err != nil {
		return err
	}
	first := "unknown (no longer in the ledger stream)"
	if !l.FirstAt.IsZero() {
		first = l.FirstAt.UTC().Format(time.RFC3339Nano)
	}
	fmt.Printf("seq:            %d\nreason:         %s\ndetail:         %s\nsubject:        %s (sequence %d)\n", l.Seq, l.Reason, l.Detail, l.Subject, l.OrigSeq)
	fmt.Printf("first delivery: %s\nlast delivery:  %s (delivery %d, dead-lettered)\n", first, l.At.UTC().Format(time.RFC3339Nano), l.Deliveries)
	if l.CommandErr != nil {
		fmt.Printf("command:        none: %v\n", l.CommandErr)
	} else {
		fmt.Printf("key:            %s\n", l.Key())
	}
	fmt.Println("headers:")
	for k, v := range l.Header {
		fmt.Printf("  %s: %v\n", k, v)
	}
	var pretty any
	if json.Unmarshal(l.Data, &pretty) == nil {
		b, _ := json.MarshalIndent(pretty, "  ", "  ")
		fmt.Printf("payload:\n  %s\n", b)
	} else {
		fmt.Printf("payload (raw): %q\n", l.Data)
	}
	return nil
}

// operator is who runs the command, for the audit.
type operator struct {
	Operator string `env:"PAYMESH_OPERATOR" help:"Who you are, for the audit record (default: your login name)."`
}

func (o operator) name() (string, error) {
	if o.Operator != "" {
		return o.Operator, nil
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username, nil
	}
	return "", errors.New("cannot tell who you are: set --operator")
}

type dlqReplayCmd struct {
	dlqConn
	dlqFilter
	operator
	Seq uint64 `arg:"" optional:"" help:"Sequence of the dead letter to replay (or use --reason/--older-than, or --all)."`
	All bool   `help:"Replay every dead letter."`
}

func (c *dlqReplayCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	filtered := c.Reason != "" || c.OlderThan > 0
	switch {
	case c.Seq != 0 && (filtered || c.All), filtered && c.All:
		return errors.New("give one of SEQ, a filter (--reason, --older-than) or --all")
	case c.Seq == 0 && !filtered && !c.All:
		return errors.New("nothing to replay: give SEQ, a filter (--reason, --older-than) or --all")
	}
	who, err := c.name()
	if err != nil {
		return err
	}
	ops, closeOps, err := c.open(ctx, t, log)
	if err != nil {
		return err
	}
	defer closeOps()
	seqs := []uint64{c.Seq}
	if c.Seq == 0 {
		seqs = nil
		for f := (dlq.Filter{Reason: c.Reason, OlderThan: c.OlderThan, Limit: 256}); ; {
			p, err := ops.List(ctx, f)
			if err != nil {
				return err
			}
			for _, l := range p.Letters {
				seqs = append(seqs, l.Seq)
			}
			if p.Next == 0 {
				break
			}
			f.After = p.Next
		}
	}
	failed := false
	for _, seq := range seqs {
		out, err := ops.Replay(ctx, seq, who)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%d: %v\n", seq, err)
			failed = true
			continue
		}
		fmt.Println(out)
	}
	if failed {
		return errFailed
	}
	return nil
}

type dlqDiscardCmd struct {
	dlqConn
	operator
	Seq uint64 `arg:"" help:"Sequence of the dead letter to discard."`
	Why string `required:"" help:"Why it is discarded (kept in the audit record)."`
}

func (c *dlqDiscardCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	who, err := c.name()
	if err != nil {
		return err
	}
	ops, closeOps, err := c.open(ctx, t, log)
	if err != nil {
		return err
	}
	defer closeOps()
	out, err := ops.Discard(ctx, c.Seq, who, c.Why)
	if err != nil {
		return err
	}
	fmt.Println(out)
	return nil
}
