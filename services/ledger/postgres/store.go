// Package postgres is the ledger's Postgres adapter: the schema (embedded,
// numbered migrations), the batched exactly-once apply, account and transfer
// reads, the transfer state machine's compare-and-set, and the invariant
// checks behind `paymesh verify`.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns every migration set a ledger database needs, in order:
// the consume-log's and the ledger's own.
func Migrations() []pgdb.Migration {
	sub, _ := fs.Sub(migrationFiles, "migrations") // cannot fail: the path is embedded
	return []pgdb.Migration{
		{FS: dedup.Migrations(), Table: dedup.MigrationTable},
		{FS: sub, Table: "ledger_schema_version"},
	}
}

// Connect opens a pool whose sessions carry the ledger's transaction lease:
// a transaction left idle for longer than lease (a hung or partitioned
// worker) is ended by Postgres, which releases its claims and locks, and its
// late COMMIT fails. lockTimeout bounds a wait for a row lock; zero means
// the lease. It returns an error for a bad URL or an unreachable server.
func Connect(ctx context.Context, url string, lease, lockTimeout time.Duration) (*pgxpool.Pool, error) {
	return connect(ctx, url, lease, lockTimeout, nil)
}

// ConnectOne is Connect for a pool of one connection, and returns the
// backend process ID of that connection as it is now (it changes when the
// pool reconnects): what tells a session's own locks from others' in
// pg_locks.
func ConnectOne(ctx context.Context, url string, lease time.Duration) (*pgxpool.Pool, func() uint32, error) {
	var pid atomic.Uint32
	pool, err := connect(ctx, url, lease, 0, func(cfg *pgxpool.Config) {
		cfg.MaxConns, cfg.MinConns = 1, 1
		cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
			pid.Store(c.PgConn().PID())
			return nil
		}
	})
	return pool, pid.Load, err
}

func connect(ctx context.Context, url string, lease, lockTimeout time.Duration, tweak func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if lockTimeout <= 0 {
		lockTimeout = lease
	}
	cfg.ConnConfig.Tracer = queryTracer{}
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(lease.Milliseconds())
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = fmt.Sprint(lockTimeout.Milliseconds())
	if tweak != nil {
		tweak(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return pool, nil
}

// Consumer is the consume-log consumer group of the ledger's transfer apply.
const Consumer = "ledger"

// Config wires a Store.
type Config struct {
	// Region is the region this database belongs to.
	Region string
	// IDs mints account IDs in Region (the region's *idgen.Generator).
	IDs IDSource
	// Regions tells an ID's home region, to route saga steps.
	Regions *idgen.Regions
	// Dedup is the consume-log (NewConsumeLog of a *dedup.Log, or a
	// decorator of one).
	Dedup ConsumeLog
	// MaxAttempts is how many times a transaction runs, at most, when it
	// meets a serialization failure, deadlock, lock timeout, business-key
	// race, lost connection or fenced claim; the last such error gives it
	// up (counted in Stats.GaveUp). 1 never retries. Default 8.
	MaxAttempts uint
	// OnRetry, if set, is told about every retried transaction attempt.
	OnRetry func(op string, attempt int, err error)
	// Stats, if set, receives the store's counters.
	Stats *ledger.Stats
	// Answers, if set, records the first answer to every client request
	// in the transaction that applies it (see Answers).
	Answers Answers
	// NoEvents turns the events off: no change is recorded as an event,
	// so the feed and the webhooks have nothing to tell.
	NoEvents bool
	// Now, if set, is the ledger's clock (default time.Now): a hold
	// expires, and its expiry step is relayed, from its ExpiresAt by it.
	Now func() time.Time
	// StepHandoff, when positive, says the caller publishes the saga
	// steps a batch writes (Result.Outbox) itself, right after COMMIT
	// (ledgerstream.StepSender): a step due now is written due
	// StepHandoff later, so that the relay leaves it alone unless the
	// caller has not marked it sent by then (a publish that failed, or a
	// crash after COMMIT). Zero: the relay sends every step, woken by the
	// commit.
	StepHandoff time.Duration
}

// IDSource mints IDs in text form; *idgen.Generator implements it.
type IDSource interface {
	NextString() (string, error)
}

var _ IDSource = (*idgen.Generator)(nil)

// Store is the ledger's Postgres adapter. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	cfg    Config
	system sync.Map // currency -> [2]string{issuance, transit account ID}
}

// New returns a Store over pool.
func New(pool *pgxpool.Pool, cfg Config) *Store {
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 8
	}
	if cfg.Stats == nil {
		cfg.Stats = &ledger.Stats{}
	}
	return &Store{pool: pool, cfg: cfg}
}

func (s *Store) stats() *ledger.Stats { return s.cfg.Stats }

func (s *Store) now() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now()
	}
	return time.Now()
}

// Pool returns the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Migrate applies the schema and creates the consume-log's day partitions.
func (s *Store) Migrate(ctx context.Context) error {
	if err := pgdb.Migrate(ctx, s.pool, Migrations()...); err != nil {
		return err
	}
	if _, err := s.cfg.Dedup.Maintain(ctx, s.pool); err != nil {
		return err
	}
	return nil
}

// Errors of the transaction runner.
var (
	// errUnknownCommit marks a COMMIT whose outcome the client could not see
	// and could not read back. The caller must not ack: a redelivery settles
	// it through the consume-log.
	errUnknownCommit = errors.New("commit outcome unknown")
	// errNotApplied marks a COMMIT that failed without an answer and was then
	// read back as not applied: safe to run again.
	errNotApplied = errors.New("commit failed and was not applied")
)

// beginQuery opens every ledger transaction. The hot statements look rows up
// by key in tables that grow fast; a generic plan made while a table was
// small (or before autovacuum analyzed it) may pick a sequential scan and
// keep it, which turns a 0.1 ms lookup into a scan of the whole table. The
// ledger never wants a sequential scan, so its transactions forbid them.
const beginQuery = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL enable_seqscan = off"

// transact runs fn in a READ COMMITTED transaction and retries the whole
// transaction on 40001 (serialization failure), 40P01 (deadlock), 55P03 (lock
// timeout) and 23505 (a unique key raced by a concurrent transaction: the
// retry sees the winner's row). When COMMIT fails without a server answer,
// committed reports whether it took effect; without one the error is
// returned wrapped in errUnknownCommit.
func (s *Store) transact(ctx context.Context, op string, fn func(pgx.Tx) error, committed func(context.Context) (bool, error)) error {
	attempt := 0
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attempt++
		err := s.once(ctx, fn, committed)
		if err == nil {
			return struct{}{}, nil
		}
		if fenced(err) {
			s.stats().Fenced.Add(1)
		}
		if !retryable(err) {
			return struct{}{}, backoff.Permanent(err)
		}
		if attempt >= int(s.cfg.MaxAttempts) {
			s.stats().GaveUp.Add(1) // the retry budget is spent
			return struct{}{}, backoff.Permanent(err)
		}
		s.stats().Retries.Add(1)
		trace.SpanFromContext(ctx).AddEvent("db.retry", trace.WithAttributes(
			attribute.String("db.operation", op), attribute.Int("paymesh.attempt", attempt), attribute.String("error", err.Error())))
		if s.cfg.OnRetry != nil {
			s.cfg.OnRetry(op, attempt, err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{
		InitialInterval: 2 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 200 * time.Millisecond,
	}), backoff.WithMaxTries(s.cfg.MaxAttempts), backoff.WithMaxElapsedTime(0))
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

func (s *Store) once(ctx context.Context, fn func(pgx.Tx) error, committed func(context.Context) (bool, error)) error {
	times := ledger.TxTimesFrom(ctx)
	if times != nil {
		times.Began = time.Now()
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginQuery})
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if times != nil {
		times.Committing = time.Now()
	}
	err = tx.Commit(ctx)
	if times != nil {
		times.Committed = time.Now()
	}
	if err == nil || committed == nil || !commitOutcomeUnknown(err) {
		return err
	}
	s.stats().CommitsUnanswered.Add(1)
	// The connection died during COMMIT: read back whether it happened
	// (the consume-log's IsMine, through committed).
	ok, rerr := committed(ctx)
	switch {
	case rerr != nil:
		return fmt.Errorf("%w: %v (the check failed: %v)", errUnknownCommit, err, rerr)
	case ok:
		return nil
	default:
		return fmt.Errorf("%w: %v", errNotApplied, err)
	}
}

// commitOutcomeUnknown reports whether a COMMIT error may have left the
// transaction committed: the server never answered.
func commitOutcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && ctxErr(err) == nil
}

func ctxErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// retryable reports whether running the whole transaction again is safe and
// may succeed. Rerunning is always safe for the apply: a transaction that did
// commit is seen by the rerun's consume-log claim.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		switch pgErr.Code {
		case "40001", "40P01", "55P03", "23505":
			return true
		}
		return fenced(err)
	case errors.Is(err, errUnknownCommit), ctxErr(err) != nil:
		return false
	case errors.Is(err, dedup.ErrLost), errors.Is(err, errNotApplied):
		return true
	}
	// A connection lost before COMMIT: the transaction rolled back.
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || pgconn.SafeToRetry(err) || isNetErr(err)
}

// fenced reports whether a transaction lost its claims and locks before it
// could commit: Postgres ended the session because the transaction sat idle
// past its transaction lease (idle_in_transaction_session_timeout, see
// Connect) or was terminated. Its late COMMIT cannot land, and a rerun sees
// whoever took over.
func fenced(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "25P03" || pgErr.Code == "57P01")
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
