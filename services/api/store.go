package api

import (
	"context"
	"crypto/sha256"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
)

// Ledger is what the API asks of its region's ledger: open accounts and
// read accounts, their change-log and transfers. services/ledger/postgres's
// Store implements it.
type Ledger interface {
	// CreateAccount opens an account, or under an idempotency key finds
	// the one the key opened for the same request (created false); it
	// returns an *ledger.Error for an invalid request, and for a key that
	// opened an account for another request.
	CreateAccount(ctx context.Context, n ledger.NewAccount) (a ledger.Account, created bool, err error)
	// Account returns an account, or an *ledger.Error with
	// ledger.CodeAccountNotFound.
	Account(ctx context.Context, id string) (ledger.Account, error)
	// PostingsPage returns up to limit change-log rows of an account with
	// a version above after, in version order.
	PostingsPage(ctx context.Context, accountID string, after int64, limit int) ([]ledger.Posting, error)
	// TransfersPage returns up to limit of a client's transfers that f
	// selects, newest first.
	TransfersPage(ctx context.Context, f ledger.TransferFilter, limit int) ([]ledger.Transfer, error)
	// AccountsPage returns up to limit of a client's accounts that f
	// selects, newest first.
	AccountsPage(ctx context.Context, f ledger.AccountFilter, limit int) ([]ledger.Account, error)
	// EventsPage returns up to limit of a client's events in this region
	// after f.After, in the region's feed order.
	EventsPage(ctx context.Context, f ledger.EventFilter, limit int) ([]ledger.RecordedEvent, error)
	// EventsAt returns the events refs name that this region holds.
	EventsAt(ctx context.Context, refs []ledger.EventRef) ([]ledger.RecordedEvent, error)
	// BalanceAt returns an account's balance, held amount and version at
	// an instant (zero before any change).
	BalanceAt(ctx context.Context, accountID string, at time.Time) (ledger.Balance, error)
	// Statement returns an account's opening and closing balance over
	// [from, to), and up to limit of the change-log rows written in it
	// with a version above after.
	Statement(ctx context.Context, accountID string, from, to time.Time, after int64, limit int) (ledger.Statement, error)
	// Transfer returns a transfer, or an *ledger.Error with
	// ledger.CodeNotFound.
	Transfer(ctx context.Context, id string) (ledger.Transfer, error)
	// TransferPostings returns a transfer's change-log rows in this region.
	TransferPostings(ctx context.Context, transferID string) ([]ledger.Posting, error)
	// Refunds returns the refunds of a transfer known in this region, and
	// the total of those that moved money.
	Refunds(ctx context.Context, id string) ([]ledger.Refund, int64, error)
	// ActionByKey returns the capture or void a client's idempotency key
	// made, or false.
	ActionByKey(ctx context.Context, client, key string) (ledger.Action, bool, error)
}

// DeadLetters is what the operator endpoints ask of the region's
// dead-letter operations, with their semantics (paged list, show, replay
// under the original key, discard with an audit record; each safe to run
// twice). services/ledger/dlq's Ops implements it; its ErrNotFound,
// ErrNotCommand and ErrUnsettled are answered with their own codes.
type DeadLetters interface {
	List(ctx context.Context, f dlq.Filter) (dlq.Page, error)
	Show(ctx context.Context, seq uint64) (dlq.Letter, error)
	Replay(ctx context.Context, seq uint64, operator string) (dlq.Outcome, error)
	Discard(ctx context.Context, seq uint64, operator, why string) (dlq.Outcome, error)
}

// Store is the API's own state in its region's database: its clients and
// their idempotency keys. services/api/apidb's Store implements it.
// Every method returns an error only when the database fails.
type Store interface {
	// Ping reports whether the database answers (GET /readyz).
	Ping(ctx context.Context) error
	// ClientByKey returns the client whose API key hashes to hash (see
	// HashKey), or false.
	ClientByKey(ctx context.Context, hash []byte) (RegisteredClient, bool, error)
	// ClientByID returns a client, or false.
	ClientByID(ctx context.Context, id string) (RegisteredClient, bool, error)
	// StartKey is the first step of a transfer request, in one round
	// trip: it reads the source account, claims the key as new only if
	// the source is a customer account of the client, and reads the
	// transfer the client's key already made (see KeyStart).
	StartKey(ctx context.Context, c KeyClaim, source string) (KeyStart, error)
	// CheckAccounts is StartKey's reads of the accounts alone, claiming
	// nothing (for a request submitted unclaimed): the source account, and
	// whether a destination in this region (c.Destination) exists.
	CheckAccounts(ctx context.Context, c KeyClaim, source string) (KeyStart, error)
	// ResolveKey locks the key's row and says what to do with it,
	// claiming it when it is missing or expired (see KeyOutcome). It
	// finds the caller's own claim (an insert whose answer was lost) by
	// its transfer ID.
	ResolveKey(ctx context.Context, c KeyClaim) (IdempotencyKey, KeyOutcome, error)
	// LookupKey says, without claiming anything, what a request's key is
	// (for a request submitted unclaimed): KeyReplay for a stored
	// response, KeyMismatch for another request's fingerprint, KeyInFlight
	// for a live claim, KeyNew for no key (or an expired one).
	LookupKey(ctx context.Context, c KeyClaim) (IdempotencyKey, KeyOutcome, error)
	// TransferByKey returns the transfer a client's idempotency key made
	// (the ledger's business key outlives the idempotency key), or false.
	TransferByKey(ctx context.Context, client, key string) (ledger.Transfer, bool, error)
	// Key reads an idempotency key, or false.
	Key(ctx context.Context, client, key string) (IdempotencyKey, bool, error)
	// AnsweredKeys returns, of the keys clients[i]/keys[i], those that are
	// answered (no longer in flight).
	AnsweredKeys(ctx context.Context, clients, keys []string) ([]IdempotencyKey, error)
	// Answer stores the response the caller is about to send, unless one
	// is already stored, and returns the key as stored: send what it
	// holds. With replace set, a stored response that is not final yet
	// (the ledger's provisional 202) is replaced. Either way the stored
	// response becomes final.
	Answer(ctx context.Context, client, key string, status int, body []byte, replace bool) (IdempotencyKey, error)
	// AnswerUnclaimed is Answer for a request whose key was not claimed
	// (the ledger stores it, ledger.Command.KeyExpiresAt): it also makes
	// the key's row, from c, when there is none or it expired. While an
	// API process's transaction is deciding the key (the key lock of
	// LockingAnswers), it stores nothing and returns the key in flight,
	// unless that transaction is the caller's own (c.ApplyPID).
	AnswerUnclaimed(ctx context.Context, c KeyClaim, status int, body []byte) (IdempotencyKey, error)
	// ClaimAccountKey records, in the key's home region, that a client's
	// account key opens its account in region, unless a request with the
	// key did before, and returns the region the first one chose. It
	// returns an *ledger.Error with ledger.CodeIdempotencyKeyReused when
	// that request had another fingerprint.
	ClaimAccountKey(ctx context.Context, client, key string, fingerprint []byte, region string) (string, error)
	// DeleteExpiredKeys removes the keys whose retention ended before now
	// and returns how many.
	DeleteExpiredKeys(ctx context.Context, now time.Time) (int64, error)
}

// RegisteredClient is an API key's holder as registered (paymesh client):
// who may call the API with it, in which role, how often, and with how
// much overdraft.
type RegisteredClient struct {
	ID         string
	Name       string
	Role       Role // RoleClient when empty
	RatePerSec int
	// MaxOverdraft is the most overdraft the client may give its accounts
	// (their floor is at least -MaxOverdraft); an operator has none.
	MaxOverdraft int64
}

// KeyInfo describes one of a client's API keys, never the key itself.
type KeyInfo struct {
	// ID is the first 8 hex digits of the key's SHA-256: what names it to
	// its owner and the operator.
	ID        string
	CreatedAt time.Time
	// ExpiresAt and RevokedAt are zero when the key has no expiry or is
	// not revoked.
	ExpiresAt, RevokedAt time.Time
}

// Valid reports whether the key authenticates at now.
func (k KeyInfo) Valid(now time.Time) bool {
	return k.RevokedAt.IsZero() && (k.ExpiresAt.IsZero() || k.ExpiresAt.After(now))
}

// Role is what an API key may do.
type Role string

// The roles of an API key.
const (
	// RoleClient: accounts and transfers (/v1/accounts, /v1/transfers).
	RoleClient Role = "client"
	// RoleOperator: the region's dead letters (/v1/ops/...); no accounts,
	// no transfers.
	RoleOperator Role = "operator"
)

// RoleOf returns c's role (RoleClient when it is not set).
func (c RegisteredClient) RoleOf() Role {
	if c.Role == "" {
		return RoleClient
	}
	return c.Role
}

// HashKey is how API keys are stored: their SHA-256. Keys are random and
// long, so a fast hash is enough (no dictionary to attack).
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// IdempotencyKey is the stored state of one client's idempotency key.
type IdempotencyKey struct {
	ClientID, Key string
	Fingerprint   []byte
	TransferID    string
	InFlight      bool
	LeaseUntil    time.Time
	// Status and Body are the stored response, once there is one; Final
	// means it will not change any more.
	Status    int
	Body      []byte
	Final     bool
	CreatedAt time.Time
	ExpiresAt time.Time
}

// KeyClaim is a request's claim on an idempotency key: a new or expired
// key is taken for TransferID with a lease until Now+Lease, kept until
// Now+TTL.
type KeyClaim struct {
	Client, Key string
	// Fingerprint identifies the request's body: the same key with another
	// fingerprint is KeyMismatch.
	Fingerprint []byte
	// TransferID is the ID the request's transfer gets if the key is new.
	TransferID string
	// Destination is the request's destination account when it lives in
	// this region: StartKey claims a new key only if it exists. Empty for
	// a destination in another region (its credit step checks it there).
	Destination string
	Now         time.Time
	Lease, TTL  time.Duration
	// ApplyPID is set when this process's own transaction for the request
	// (api.Config.Apply) may still be running: the Postgres backend that
	// runs it. A key lock held by that backend is this request's own, and
	// AnswerUnclaimed does not yield to it.
	ApplyPID uint32
}

// KeyOutcome is what a key claim found.
type KeyOutcome int

// Outcomes of a key claim.
const (
	// KeyNew: the key was free (or expired); the caller owns it now.
	KeyNew KeyOutcome = iota + 1
	// KeyTakenOver: the key was in flight under an expired lease (its
	// holder died); the caller owns it now and must submit the same
	// transfer again.
	KeyTakenOver
	// KeyReplay: the key has a stored response; return it.
	KeyReplay
	// KeyInFlight: another request holds the key right now.
	KeyInFlight
	// KeyMismatch: the key was used with a different request body.
	KeyMismatch
)

// KeyStart is what StartKey found.
type KeyStart struct {
	// Source is the request's source account; SourceFound is false when
	// it does not exist.
	Source      ledger.Account
	SourceFound bool
	// DestinationMissing is set when KeyClaim.Destination names no account
	// (and so no key was claimed).
	DestinationMissing bool
	// DestinationSystem is set when KeyClaim.Destination is one of the
	// region's own accounts (issuance, transit), which no client pays
	// into (and so no key was claimed).
	DestinationSystem bool
	// Claimed is set when the key was new and is now claimed (Key); when
	// it is not, and the source is the client's, the key exists:
	// ResolveKey says what to do with it.
	Claimed bool
	Key     IdempotencyKey
	// Prior is the transfer the client's key already made (its business
	// key outlives the idempotency key); zero when there is none.
	Prior ledger.Transfer
}
