package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// CeilingRun is the ceiling baseline: the ledger's apply transaction, its
// own SQL alone, from a loop that does no decoding, planning or NATS.
type CeilingRun struct {
	Transfers    int     `json:"transfers"` // committed
	Transactions int64   `json:"transactions"`
	BatchSize    int     `json:"batch_size"`
	Loops        int     `json:"loops"` // transactions in flight, as many as the ledger's workers
	Capped       bool    `json:"capped,omitempty"`
	Seconds      float64 `json:"seconds"`
	Rate         float64 `json:"rate"`
	MeanTxMs     float64 `json:"mean_tx_ms"` // BEGIN to COMMIT's answer
	// CPU per committed transfer in microseconds: this process (the loops)
	// and the run database's Postgres backends (-1 when /proc could not be
	// read).
	CPUPerTransferUs   float64 `json:"cpu_per_transfer_us"`
	PGCPUPerTransferUs float64 `json:"pg_cpu_per_transfer_us"`
	Verified           bool    `json:"verified"`
	VerifyReport       string  `json:"verify_report,omitempty"`
}

func (c CeilingRun) line() string {
	capped := ""
	if c.Capped {
		capped = "  (stopped at the time limit)"
	}
	return fmt.Sprintf("%-13s %8.0f/s  %d transfers in %d transactions of %d in %.1fs (%d loops, %.1f ms each)  CPU %.0f µs/msg + Postgres %.0f µs/msg%s  %s",
		Ceiling, c.Rate, c.Transfers, c.Transactions, c.BatchSize, c.Seconds, c.Loops, c.MeanTxMs, c.CPUPerTransferUs, c.PGCPUPerTransferUs,
		capped, invariants(c.Verified, c.VerifyReport))
}

// The apply transaction's statements, copied from services/ledger/postgres,
// which keeps them unexported: its BEGIN (store.go, beginQuery), the claim
// stage's account locks and business-key lookup (apply.go, queueLockState
// and queueExistingTransfers, with the column lists of accounts.go and
// transfers.go), and the write stage's inserts of transfers, postings and
// events and its balance update (apply.go, queuePlan and updateBalancesSQL;
// events.go, insertEventsSQL). TestCeilingSQLIsApplys fails when a copy and
// its source drift apart. The claim is pkg/dedup's own (QueueClaimForTx).
const (
	ceilingBeginSQL = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL enable_seqscan = off"

	ceilingTransferColumns = `id, client_id, idempotency_key, fingerprint, from_account, to_account, amount, currency,
	status, coalesce(reason, ''), version, created_at, expires_at, coalesce(captured_amount, 0), coalesce(refund_of, ''),
	refunded_amount, coalesce(reference, ''), metadata`

	ceilingKeysSQL = `
		SELECT t.* FROM unnest($1::text[], $2::text[]) AS k(client_id, idempotency_key)
		CROSS JOIN LATERAL (
		    -- LIMIT 1 keeps this a per-key index lookup whatever the plan.
		    SELECT ` + ceilingTransferColumns + ` FROM transfers
		    WHERE client_id = k.client_id AND idempotency_key = k.idempotency_key LIMIT 1) t
		UNION
		SELECT ` + ceilingTransferColumns + ` FROM transfers WHERE id = ANY($3::text[])`

	ceilingEventsSQL = `
	WITH ev AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::bigint[])
		     WITH ORDINALITY AS u(account_id, client_id, type, object_id, status, reason, version, captured_amount, ord)
	), n AS (
		SELECT account_id, count(*) AS c FROM ev GROUP BY account_id
	), seq AS (
		INSERT INTO event_sequences AS s (account_id, last)
		SELECT account_id, c FROM n ORDER BY account_id
		ON CONFLICT (account_id) DO UPDATE SET last = s.last + excluded.last
		RETURNING account_id, last
	)
	INSERT INTO events (account_id, sequence, client_id, type, object_id, status, reason, version, captured_amount)
	SELECT ev.account_id, seq.last - n.c + row_number() OVER (PARTITION BY ev.account_id ORDER BY ev.ord),
	       coalesce(acc.client_id, ev.client_id), ev.type, ev.object_id, ev.status, ev.reason, ev.version, ev.captured_amount
	FROM ev JOIN n USING (account_id) JOIN seq USING (account_id) LEFT JOIN accounts acc ON acc.id = ev.account_id`

	ceilingLockSQL = `SELECT id, client_id, kind, currency, balance, floor, closed, version, created_at, held, frozen FROM accounts WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`

	ceilingTransfersSQL = `
			INSERT INTO transfers (id, client_id, idempotency_key, type, from_account, to_account, currency, status, reason,
			                       fingerprint, amount, version, created_at, expires_at, refund_of, reference, metadata, held_at)
			SELECT *, CASE WHEN u.status = 'HELD' THEN statement_timestamp() END
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
			            $9::text[], $10::bytea[], $11::bigint[], $12::bigint[], $13::timestamptz[], $14::timestamptz[], $15::text[],
			            $16::text[], $17::jsonb[])
			     AS u(id, client_id, idempotency_key, type, from_account, to_account, currency, status, reason,
			          fingerprint, amount, version, created_at, expires_at, refund_of, reference, metadata)`

	ceilingPostingsSQL = `
			INSERT INTO postings (transfer_id, leg, account_id, amount, balance_after, account_version)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])`

	ceilingBalancesSQL = `
	UPDATE accounts a SET balance = u.balance, version = u.to_version, held = u.held
	FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[])
	     AS u(id, from_version, to_version, balance, from_held, held)
	WHERE a.id = u.id AND a.version = u.from_version AND a.held = u.from_held`
)

// ceilingTransfer is one transfer of the ceiling run, with every value its
// rows need computed before the run.
type ceilingTransfer struct {
	id, key, from, to string
	amount            int64
	fp                []byte
	msgKey            string
}

// ceiling runs the ledger's apply transaction without the ledger: on a
// database of its own, migrated and funded as the uniform run's, Workers
// loops each commit BatchSize transfers a transaction, drawn as the uniform
// run draws them, with the apply's own statements in its two round trips:
// the consume-log claims (pkg/dedup) and the account locks pipelined, then
// the transfers, the change-log and the balance compare-and-set pipelined,
// then COMMIT, durable as the server is configured.
func (e *env) ceiling(ctx context.Context) (CeilingRun, error) {
	gen, err := idgen.NewGenerator(e.regions, region, 1)
	if err != nil {
		return CeilingRun{}, err
	}
	db, err := e.openRegionDB(ctx, Ceiling, gen)
	if err != nil {
		return CeilingRun{}, err
	}
	defer db.close(ctx)
	pool, store, accounts, log := db.pool, db.store, db.accounts, db.log
	w, err := e.newWorkload(Ceiling+strconv.FormatInt(e.seq.Add(1), 10), e.cfg.Transfers, len(accounts), -1)
	if err != nil {
		return CeilingRun{}, err
	}
	xs := make([]ceilingTransfer, len(w.from))
	for i := range xs {
		c := w.command(e, accounts, i)
		xs[i] = ceilingTransfer{id: c.TransferID, key: c.IdempotencyKey, from: c.From, to: c.To, amount: c.Amount,
			fp: c.Fingerprint(), msgKey: c.MsgKey()}
	}
	e.checkpoint(ctx)

	res := CeilingRun{BatchSize: e.cfg.BatchSize, Loops: e.cfg.Workers}
	var next, done, txs, txNanos atomic.Int64
	stop := e.progress(Ceiling, func() (int64, int64) { return done.Load(), int64(len(xs)) })
	pg0, cpu0 := pgBackends(ctx, pool, db.name), cpuTime()
	start := time.Now()
	var capped atomic.Bool
	errs := make(chan error, res.Loops)
	var wg sync.WaitGroup
	for range res.Loops {
		wg.Go(func() {
			for ctx.Err() == nil {
				if time.Since(start) > e.cfg.Limit {
					capped.Store(true)
					return
				}
				lo := int(next.Add(int64(res.BatchSize))) - res.BatchSize
				if lo >= len(xs) {
					return
				}
				batch := xs[lo:min(lo+res.BatchSize, len(xs))]
				began := time.Now()
				if err := applyCeiling(ctx, pool, log, batch, time.Now()); err != nil {
					errs <- fmt.Errorf("%s: %w", Ceiling, err)
					return
				}
				txNanos.Add(int64(time.Since(began)))
				txs.Add(1)
				done.Add(int64(len(batch)))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	pgCPU, pgOK := pgCPUDelta(pg0, pgBackends(ctx, pool, db.name))
	stop()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.Transfers, res.Transactions, res.Capped, res.Seconds = int(done.Load()), txs.Load(), capped.Load(), elapsed.Seconds()
	res.Rate = float64(res.Transfers) / elapsed.Seconds()
	if res.Transactions > 0 {
		res.MeanTxMs = float64(txNanos.Load()) / float64(res.Transactions) / 1e6
	}
	res.CPUPerTransferUs = float64(cpu.Microseconds()) / float64(max(res.Transfers, 1))
	res.PGCPUPerTransferUs = -1
	if pgOK {
		res.PGCPUPerTransferUs = float64(pgCPU.Microseconds()) / float64(max(res.Transfers, 1))
	}

	// The loop wrote what the ledger writes: the invariants hold and every
	// transfer is recorded once.
	rep, err := store.Verify(ctx)
	if err != nil {
		return res, err
	}
	var recorded int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM transfers WHERE type = 'transfer' AND status = 'COMPLETED'`).Scan(&recorded); err != nil {
		return res, err
	}
	res.Verified = rep.OK() && recorded == int64(res.Transfers)
	if !res.Verified {
		res.VerifyReport = fmt.Sprintf("%d completed transfers recorded, want %d\n%s", recorded, res.Transfers, rep)
	}
	return res, nil
}

// applyCeiling commits one batch of transfers in one transaction of the
// apply's round trips: BEGIN; the claims and the account locks; the
// transfers, postings and balances; COMMIT. A claim that is not First, or
// a balance update that misses, is an error: the workload never repeats a
// key, and the locks hold the versions read.
func applyCeiling(ctx context.Context, pool *pgxpool.Pool, log *dedup.Log, xs []ceilingTransfer, now time.Time) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{BeginQuery: ceilingBeginSQL}, func(tx pgx.Tx) error {
		keys := make([]dedup.Key, len(xs))
		ids := make([]string, 0, 2*len(xs))
		clients, ikeys, tids := make([]string, len(xs)), make([]string, len(xs)), make([]string, len(xs))
		for i, x := range xs {
			keys[i] = dedup.Key{ID: x.msgKey, Origin: now, Fingerprint: x.fp}
			ids = append(ids, x.from, x.to)
			clients[i], ikeys[i], tids[i] = Client, x.key, x.id
		}
		slices.Sort(ids)
		ids = slices.Compact(ids)

		b := &pgx.Batch{}
		pending, err := log.QueueClaimForTx(b, postgres.Consumer, keys)
		if err != nil {
			return err
		}
		known := 0
		b.Queue(ceilingKeysSQL, clients, ikeys, tids).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				known++
			}
			return rows.Err()
		})
		type row struct{ balance, version, from int64 }
		acc := make(map[string]*row, len(ids))
		b.Queue(ceilingLockSQL, ids).Query(func(rows pgx.Rows) error {
			var (
				id, client, kind, cur string
				balance, floor, ver   int64
				held                  int64
				closed, frozen        bool
				created               time.Time
			)
			_, err := pgx.ForEachRow(rows, []any{&id, &client, &kind, &cur, &balance, &floor, &closed, &ver, &created, &held, &frozen}, func() error {
				acc[id] = &row{balance: balance, version: ver, from: ver}
				return nil
			})
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("claim and lock: %w", err)
		}
		claims, err := pending.Finish(ctx, tx)
		if err != nil {
			return err
		}
		for _, c := range claims {
			if c.Outcome != dedup.First {
				return fmt.Errorf("claim %s: %v, want first", c.Key.ID, c.Outcome)
			}
		}
		if len(acc) != len(ids) {
			return fmt.Errorf("locked %d of %d accounts", len(acc), len(ids))
		}
		if known != 0 {
			return fmt.Errorf("%d transfers already recorded under the batch's keys, want none", known)
		}

		n := len(xs)
		var (
			tID, tClient, tKey, tType, tFrom, tTo, tCur, tStatus = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			tReason                                              = make([]*string, n)
			tFP                                                  = make([][]byte, n)
			tAmount, tVersion                                    = make([]int64, n), make([]int64, n)
			tCreated                                             = make([]time.Time, n)
			tExpires                                             = make([]*time.Time, n)
			tRefundOf                                            = make([]*string, n)
			pTransfer, pLeg, pAccount                            = make([]string, 0, 2*n), make([]string, 0, 2*n), make([]string, 0, 2*n)
			pAmount, pAfter, pVersion                            = make([]int64, 0, 2*n), make([]int64, 0, 2*n), make([]int64, 0, 2*n)
			// Each transfer's events, as the apply writes them for a
			// transfer completed in one region: created, then completed,
			// both in the payer's feed.
			eAccount, eClient, eType, eObject, eStatus = make([]string, 0, 2*n), make([]string, 0, 2*n), make([]string, 0, 2*n), make([]string, 0, 2*n), make([]string, 0, 2*n)
			eReason                                    = make([]*string, 2*n)
			eVersion, eCaptured                        = make([]int64, 0, 2*n), make([]int64, 2*n)
		)
		post := func(transfer, leg, account string, amount int64) {
			a := acc[account]
			a.balance += amount
			a.version++
			pTransfer, pLeg, pAccount = append(pTransfer, transfer), append(pLeg, leg), append(pAccount, account)
			pAmount, pAfter, pVersion = append(pAmount, amount), append(pAfter, a.balance), append(pVersion, a.version)
		}
		for i, x := range xs {
			tID[i], tClient[i], tKey[i], tType[i], tFrom[i], tTo[i], tCur[i], tStatus[i] = x.id, Client, x.key, ledger.TypeTransfer, x.from, x.to, "EUR", string(ledger.StatusCompleted)
			tFP[i], tAmount[i], tVersion[i], tCreated[i] = x.fp, x.amount, 1, now
			post(x.id, string(ledger.LegDebit), x.from, -x.amount)
			post(x.id, string(ledger.LegCredit), x.to, x.amount)
			for _, typ := range []ledger.EventType{ledger.TransferCreated, ledger.TransferCompleted} {
				eAccount, eClient, eType, eObject = append(eAccount, x.from), append(eClient, Client), append(eType, string(typ)), append(eObject, x.id)
				eStatus, eVersion = append(eStatus, string(ledger.StatusCompleted)), append(eVersion, 1)
			}
		}
		aID := make([]string, len(ids))
		aFrom, aTo, aBal, aHeld := make([]int64, len(ids)), make([]int64, len(ids)), make([]int64, len(ids)), make([]int64, len(ids))
		for i, id := range ids {
			a := acc[id]
			aID[i], aFrom[i], aTo[i], aBal[i] = id, a.from, a.version, a.balance // nothing is held in this run: aHeld stays 0
		}

		b = &pgx.Batch{}
		b.Queue(ceilingTransfersSQL, tID, tClient, tKey, tType, tFrom, tTo, tCur, tStatus, tReason, tFP, tAmount, tVersion, tCreated, tExpires, tRefundOf,
			[]*string(nil), []*string(nil)) // no references or metadata: NULL arrays, as the apply sends them
		b.Queue(ceilingPostingsSQL, pTransfer, pLeg, pAccount, pAmount, pAfter, pVersion)
		b.Queue(ceilingEventsSQL, eAccount, eClient, eType, eObject, eStatus, eReason, eVersion, eCaptured)
		b.Queue(ceilingBalancesSQL, aID, aFrom, aTo, aBal, aHeld, aHeld).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != int64(len(aID)) {
				return errors.New("balance compare-and-set missed an account")
			}
			return nil
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	})
}
