package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

const (
	keyOps  = "key-ops-alice-0123456789"
	keyOps2 = "key-ops-bob-0123456789ab"
)

// opsEnv runs region eu with its API connected as the region's operator
// user, client A (keyA) and operators alice and bob. While failing is set,
// every ledger commit fails (a database that is down): a transfer is
// dead-lettered after its second delivery (max_deliveries).
func opsEnv(t *testing.T) (*env, *atomic.Bool, *pgxpool.Pool) {
	t.Helper()
	topo := natsembed.MustStartTopology(t, "eu")
	ops, err := natsauth.UserOf("eu", natsauth.Ops)
	if err != nil {
		t.Fatal(err)
	}
	failing := new(atomic.Bool)
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: map[string]uint8{"eu": 1}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_apiops_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e6),
		Shards:         2, BatchSize: 16, AckWait: time.Second, DuplicateWindow: time.Second, APIWait: time.Second,
		BeforeCommit: func(context.Context) error {
			if failing.Load() {
				return errors.New("database unavailable")
			}
			return nil
		},
		Ledger: func(_ string, c *ledgerd.Config) { c.MaxDeliver = 2 },
		API:    func(_ string, c *apid.Config) { c.OpsNATSUser, c.OpsNATSPassword = ops.Name, ops.Password },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		_ = c.Drop(context.Background())
	})
	store := c.Region("eu").APIStore
	for _, cl := range []struct {
		c   api.RegisteredClient
		key string
	}{
		{api.RegisteredClient{ID: "a", Name: "A"}, keyA},
		{api.RegisteredClient{ID: "alice", Role: api.RoleOperator}, keyOps},
		{api.RegisteredClient{ID: "bob", Role: api.RoleOperator}, keyOps2},
	} {
		if err := store.PutClient(ctx, cl.c, cl.key); err != nil {
			t.Fatal(err)
		}
	}
	gen, err := idgen.NewGenerator(c.IDs(), "eu", 901)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, c.Region("eu").URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &env{c: c, gens: map[string]*idgen.Generator{"eu": gen}}, failing, pool
}

func count(t *testing.T, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// letters lists the dead letters through the API with the operator key.
func letters(t *testing.T, e *env, query string) api.DeadLettersBody {
	t.Helper()
	r := e.do(t, "eu", "GET", "/v1/ops/dead-letters"+query, keyOps, "", "")
	if r.status != http.StatusOK {
		t.Fatalf("list%s: %d %s", query, r.status, r.body)
	}
	var p api.DeadLettersBody
	r.json(t, &p)
	if p.Region != "eu" {
		t.Fatalf("list%s: region %q, want eu", query, p.Region)
	}
	return p
}

func waitLetters(t *testing.T, e *env, n int) []api.DeadLetterBody {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if p := letters(t, e, ""); len(p.DeadLetters) >= n {
			return p.DeadLetters
		}
	}
	t.Fatalf("fewer than %d dead letters after 30s", n)
	return nil
}

// replay replays seq with the operator key until the outcome is no longer
// deferred (the Msg-Id window still holds the dead-lettered publish).
func replay(t *testing.T, e *env, seq uint64, key string) api.DeadLetterOutcomeBody {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		r := e.do(t, "eu", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/replay", seq), key, "", "")
		if r.status != http.StatusOK {
			t.Fatalf("replay %d: %d %s", seq, r.status, r.body)
		}
		var out api.DeadLetterOutcomeBody
		r.json(t, &out)
		if out.Outcome != "deferred" {
			return out
		}
		if out.RetryAt == nil || r.header.Get("Retry-After") == "" || time.Now().After(deadline) {
			t.Fatalf("replay %d deferred: %s (Retry-After %q)", seq, r.body, r.header.Get("Retry-After"))
		}
		time.Sleep(time.Until(*out.RetryAt) + 100*time.Millisecond)
	}
}

// TestOperatorEndpoints: two dead letters made for real (a transfer to an
// account that does not exist, and one whose commits failed on every
// delivery) are listed, filtered, paged and shown through the API with an
// operator key; the lost transfer is applied once by replay and a second
// replay changes nothing; the refusal is refused again; a discard is
// recorded once under the operator's name. A client key reaches none of
// it and changes nothing, an operator key moves no money, and bad input
// gets a 400 or 404 that says what is wrong.
func TestOperatorEndpoints(t *testing.T) {
	e, failing, pool := opsEnv(t)
	a := e.account(t, "eu", keyA, 100)
	b := e.account(t, "eu", keyA, 0)

	ghost := e.id(t, "eu") // no such account
	// The API refuses it before claiming the key, so nothing is published.
	if r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "ghost-1", transferJSON(a, ghost, 5)); r.status != 404 || r.code(t) != ledger.CodeAccountNotFound {
		t.Fatalf("transfer to a missing account: %d %s, want 404 account_not_found", r.status, r.body)
	}
	if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE key = 'ghost-1'`); n != 0 {
		t.Fatalf("idempotency keys of the refused request: %d, want none", n)
	}
	// The same command reaching the ledger another way (here straight
	// through the router) awaits its account: dead-lettered, unrecorded.
	ghostCmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: e.id(t, "eu"), ClientID: "a", IdempotencyKey: "ghost-2",
		From: a, To: ghost, Amount: 5, Currency: "EUR", CreatedAt: time.Now()}
	if err := e.c.Submit(context.Background(), "eu", ghostCmd); err != nil {
		t.Fatal(err)
	}
	waitLetters(t, e, 1)
	failing.Store(true)
	r := e.do(t, "eu", "POST", "/v1/transfers", keyA, "lost-1", transferJSON(a, b, 10))
	if r.status != http.StatusAccepted {
		t.Fatalf("transfer while the commits fail: %d %s, want 202", r.status, r.body)
	}
	var lost api.TransferBody
	r.json(t, &lost)
	all := waitLetters(t, e, 2)
	failing.Store(false)
	ghostSeq, lostSeq := all[0].Seq, all[1].Seq
	if all[0].Reason != string(ledger.CodeAccountNotFound) || all[1].Reason != ledgerstream.ReasonMaxDeliveries || all[1].Deliveries != 2 {
		t.Fatalf("dead letters: got %+v, want account_not_found then max_deliveries after 2 deliveries", all)
	}
	if !strings.HasSuffix(all[1].Key, "/lost-1") || all[1].Subject == "" || all[1].LedgerSeq == 0 {
		t.Fatalf("lost transfer's dead letter: got %+v, want its key, subject and ledger sequence", all[1])
	}

	t.Run("ClientKeyIsRefused", func(t *testing.T) {
		for _, rq := range []struct{ method, path, body string }{
			{"GET", "/v1/ops/dead-letters", ""},
			{"GET", fmt.Sprintf("/v1/ops/dead-letters/%d", lostSeq), ""},
			{"POST", fmt.Sprintf("/v1/ops/dead-letters/%d/replay", lostSeq), ""},
			{"POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), `{"reason":"not mine to discard"}`},
		} {
			if r := e.do(t, "eu", rq.method, rq.path, keyA, "", rq.body); r.status != 403 || r.code(t) != api.CodeOperatorOnly {
				t.Errorf("client key on %s %s: %d %s, want 403 operator_only", rq.method, rq.path, r.status, r.body)
			}
			if r := e.do(t, "eu", rq.method, rq.path, "", "", rq.body); r.status != 401 || r.code(t) != api.CodeUnauthorized {
				t.Errorf("no key on %s %s: %d %s, want 401 unauthorized", rq.method, rq.path, r.status, r.body)
			}
		}
		if n := len(letters(t, e, "").DeadLetters); n != 2 {
			t.Errorf("dead letters after the refused calls: %d, want 2", n)
		}
		if n := count(t, pool, `SELECT count(*) FROM dlq_audit`); n != 0 {
			t.Errorf("audit rows after the refused calls: %d, want 0", n)
		}
	})
	t.Run("OperatorKeyMovesNoMoney", func(t *testing.T) {
		for _, rq := range []struct{ method, path, key, body string }{
			{"POST", "/v1/accounts", "", `{"currency":"EUR"}`},
			{"GET", "/v1/accounts/" + a, "", ""},
			{"GET", "/v1/accounts/" + a + "/entries", "", ""},
			{"POST", "/v1/transfers", "op-1", transferJSON(a, b, 1)},
			{"GET", "/v1/transfers/" + lost.ID, "", ""},
		} {
			if r := e.do(t, "eu", rq.method, rq.path, keyOps, rq.key, rq.body); r.status != 403 || r.code(t) != api.CodeClientOnly {
				t.Errorf("operator key on %s %s: %d %s, want 403 client_only", rq.method, rq.path, r.status, r.body)
			}
		}
		if n := count(t, pool, `SELECT count(*) FROM accounts WHERE client_id = 'alice'`); n != 0 {
			t.Errorf("accounts of the operator: %d, want 0", n)
		}
	})

	t.Run("ListFilters", func(t *testing.T) {
		for _, tc := range []struct {
			query string
			want  []uint64
			next  uint64
		}{
			{"?reason=account_not_found", []uint64{ghostSeq}, 0},
			{"?reason=max_deliveries&limit=5", []uint64{lostSeq}, 0},
			{"?reason=insufficient_funds", nil, 0},
			{"?older_than=1h", nil, 0},
			{"?older_than=1ms", []uint64{ghostSeq, lostSeq}, 0},
			{"?limit=1", []uint64{ghostSeq}, ghostSeq},
			{fmt.Sprintf("?limit=1&after=%d", ghostSeq), []uint64{lostSeq}, 0},
			{fmt.Sprintf("?after=%d", lostSeq), nil, 0},
		} {
			p := letters(t, e, tc.query)
			var got []uint64
			for _, l := range p.DeadLetters {
				got = append(got, l.Seq)
			}
			var next uint64
			if p.NextAfter != nil {
				next = *p.NextAfter
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || next != tc.next {
				t.Errorf("list%s: got %v next %d, want %v next %d", tc.query, got, next, tc.want, tc.next)
			}
		}
	})
	t.Run("Show", func(t *testing.T) {
		r := e.do(t, "eu", "GET", fmt.Sprintf("/v1/ops/dead-letters/%d", lostSeq), keyOps, "", "")
		if r.status != http.StatusOK {
			t.Fatalf("show: %d %s", r.status, r.body)
		}
		var l api.DeadLetterDetailBody
		r.json(t, &l)
		var cmd ledger.Command
		if err := json.Unmarshal(l.Command, &cmd); err != nil || cmd.TransferID != lost.ID || cmd.Amount != 10 || string(l.Payload) != string(l.Command) {
			t.Fatalf("show: command %s (%v), payload %q: want the lost transfer %s", l.Command, err, l.Payload, lost.ID)
		}
		if l.Region != "eu" || l.FirstDeliveryAt == nil || l.LastDeliveryAt.Before(*l.FirstDeliveryAt) || l.Deliveries != 2 ||
			l.Headers[ledgerstream.HeaderDLQReason][0] != ledgerstream.ReasonMaxDeliveries || l.CommandError != "" {
			t.Fatalf("show: got %s, want eu, first and last delivery, 2 deliveries, the reason header", r.body)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		for _, tc := range []struct {
			name, method, path, body string
			status                   int
			code                     ledger.Code
			detail                   string
		}{
			{"ReasonUnknown", "GET", "/v1/ops/dead-letters?reason=lost", "", 400, ledger.CodeInvalidRequest, `reason="lost" is not a dead-letter reason`},
			{"ReasonUpperCase", "GET", "/v1/ops/dead-letters?reason=ACCOUNT_NOT_FOUND", "", 400, ledger.CodeInvalidRequest, "not a dead-letter reason"},
			{"ReasonEmpty", "GET", "/v1/ops/dead-letters?reason=", "", 400, ledger.CodeInvalidRequest, "not a dead-letter reason"},
			{"OlderThanNoUnit", "GET", "/v1/ops/dead-letters?older_than=15", "", 400, ledger.CodeInvalidRequest, `older_than="15" is not a positive duration`},
			{"OlderThanNegative", "GET", "/v1/ops/dead-letters?older_than=-1h", "", 400, ledger.CodeInvalidRequest, "not a positive duration"},
			{"OlderThanZero", "GET", "/v1/ops/dead-letters?older_than=0s", "", 400, ledger.CodeInvalidRequest, "not a positive duration"},
			{"LimitZero", "GET", "/v1/ops/dead-letters?limit=0", "", 400, ledger.CodeInvalidRequest, `limit="0" is not between 1 and 500`},
			{"LimitOver", "GET", "/v1/ops/dead-letters?limit=501", "", 400, ledger.CodeInvalidRequest, "not between 1 and 500"},
			{"LimitNotANumber", "GET", "/v1/ops/dead-letters?limit=ten", "", 400, ledger.CodeInvalidRequest, "not between 1 and 500"},
			{"AfterNegative", "GET", "/v1/ops/dead-letters?after=-1", "", 400, ledger.CodeInvalidRequest, `after="-1" is not a dead-letter sequence`},
			{"UnknownParameter", "GET", "/v1/ops/dead-letters?reasons=account_not_found", "", 400, ledger.CodeInvalidRequest, `unknown query parameter "reasons"`},
			{"RepeatedParameter", "GET", "/v1/ops/dead-letters?limit=1&limit=2", "", 400, ledger.CodeInvalidRequest, `"limit" given 2 times`},
			{"ShowSeqNotANumber", "GET", "/v1/ops/dead-letters/abc", "", 400, ledger.CodeInvalidRequest, `"abc" is not a dead-letter sequence`},
			{"ShowSeqZero", "GET", "/v1/ops/dead-letters/0", "", 400, ledger.CodeInvalidRequest, "not a dead-letter sequence"},
			{"ShowSeqOverflow", "GET", "/v1/ops/dead-letters/18446744073709551616", "", 400, ledger.CodeInvalidRequest, "not a dead-letter sequence"},
			{"ReplaySeqNegative", "POST", "/v1/ops/dead-letters/-3/replay", "", 400, ledger.CodeInvalidRequest, "not a dead-letter sequence"},
			{"DiscardSeqNotANumber", "POST", "/v1/ops/dead-letters/x/discard", `{"reason":"r"}`, 400, ledger.CodeInvalidRequest, "not a dead-letter sequence"},
			{"ReplayWithABody", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/replay", lostSeq), `{"force":true}`, 400, ledger.CodeInvalidRequest, `unknown field "force"`},
			{"DiscardNoBody", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), "", 400, ledger.CodeInvalidRequest, "must be a JSON object"},
			{"DiscardNoReason", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), `{}`, 400, ledger.CodeInvalidRequest, "a discard needs a reason"},
			{"DiscardBlankReason", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), `{"reason":"  "}`, 400, ledger.CodeInvalidRequest, "a discard needs a reason"},
			{"DiscardReasonNotAString", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), `{"reason":7}`, 400, ledger.CodeInvalidRequest, "malformed JSON"},
			{"DiscardUnknownField", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), `{"reason":"r","why":"w"}`, 400, ledger.CodeInvalidRequest, `unknown field "why"`},
			{"DiscardReasonTooLong", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), `{"reason":"` + strings.Repeat("x", api.MaxDiscardReason+1) + `"}`, 400, ledger.CodeInvalidRequest, "over the 1000-byte limit"},
			{"ShowUnknown", "GET", "/v1/ops/dead-letters/999", "", 404, api.CodeDeadLetterNotFound, "DLQ_EU has no sequence 999"},
			{"ReplayUnknown", "POST", "/v1/ops/dead-letters/999/replay", "", 404, api.CodeDeadLetterNotFound, "no operator touched it"},
			{"DiscardUnknown", "POST", "/v1/ops/dead-letters/999/discard", `{"reason":"r"}`, 404, api.CodeDeadLetterNotFound, "no operator touched it"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := e.do(t, "eu", tc.method, tc.path, keyOps, "", tc.body)
				var p api.Problem
				r.json(t, &p)
				if r.status != tc.status || p.Code != tc.code || !strings.Contains(p.Detail, tc.detail) {
					t.Fatalf("got %d %s, want %d %s with %q", r.status, r.body, tc.status, tc.code, tc.detail)
				}
			})
		}
		t.Run("DiscardNotJSON", func(t *testing.T) {
			r := e.doWith(t, "eu", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), keyOps, "reason=r", http.Header{"Content-Type": {"text/plain"}})
			if r.status != 415 || r.code(t) != api.CodeUnsupportedMediaType {
				t.Fatalf("got %d %s, want 415 unsupported_media_type", r.status, r.body)
			}
		})
		if n := len(letters(t, e, "").DeadLetters); n != 2 {
			t.Errorf("dead letters after bad input: %d, want 2", n)
		}
		if n := count(t, pool, `SELECT count(*) FROM dlq_audit`); n != 0 {
			t.Errorf("audit rows after bad input: %d, want 0", n)
		}
	})

	// The lost transfer: applied once by replay, and a second replay, by
	// another operator, answers with the first and changes nothing.
	out := replay(t, e, lostSeq, keyOps)
	if out.Region != "eu" || out.Outcome != "applied" || out.Operator != "alice" || out.LedgerSeq == 0 || !strings.HasSuffix(out.Key, "/lost-1") {
		t.Fatalf("replay of the lost transfer: got %+v, want applied by alice", out)
	}
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, b); got != 10 {
		t.Fatalf("destination after the replay: got %d, want 10", got)
	}
	if r := e.do(t, "eu", "GET", "/v1/transfers/"+lost.ID, keyA, "", ""); !strings.Contains(string(r.body), `"status":"COMPLETED"`) {
		t.Fatalf("the lost transfer after the replay: %d %s, want COMPLETED", r.status, r.body)
	}
	again := replay(t, e, lostSeq, keyOps2)
	if again.Outcome != "replayed" || again.Operator != "alice" || again.At == nil || again.Key != out.Key {
		t.Fatalf("second replay: got %+v, want the first, replayed by alice", again)
	}
	e.quiet(t)
	if got := e.balance(t, "eu", keyA, b); got != 10 {
		t.Fatalf("destination after a second replay: got %d, want 10", got)
	}

	// The refusal is refused again and leaves a new dead letter, which is
	// discarded once, under the operator's name, however often it is asked.
	refused := replay(t, e, ghostSeq, keyOps)
	if refused.Outcome != "refused" || refused.Reason != string(ledger.CodeAccountNotFound) || refused.NewDeadLetter == 0 {
		t.Fatalf("replay of the refusal: got %+v, want refused account_not_found with a new dead letter", refused)
	}
	seq := refused.NewDeadLetter
	path := fmt.Sprintf("/v1/ops/dead-letters/%d/discard", seq)
	for _, key := range []string{keyOps, keyOps, keyOps2} {
		r := e.do(t, "eu", "POST", path, key, "", `{"reason":"the customer closed the account"}`)
		var d api.DeadLetterOutcomeBody
		r.json(t, &d)
		if r.status != 200 || d.Outcome != "discarded" || d.Operator != "alice" || d.Why != "the customer closed the account" || d.At == nil || d.Seq != seq {
			t.Fatalf("discard %d: %d %s, want discarded by alice", seq, r.status, r.body)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM dlq_audit WHERE action = 'discard' AND dlq_seq = $1 AND operator = 'alice' AND why = 'the customer closed the account'`, int64(seq)); n != 1 {
		t.Fatalf("discard records: %d, want 1 by alice", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM dlq_audit WHERE action = 'replay' AND operator = 'alice'`); n != 2 {
		t.Fatalf("replay records: %d, want 2 by alice (the lost transfer, the refusal)", n)
	}
	// A discard of a dead letter replayed before answers with the replay.
	r = e.do(t, "eu", "POST", fmt.Sprintf("/v1/ops/dead-letters/%d/discard", lostSeq), keyOps, "", `{"reason":"late"}`)
	if r.status != 200 || !strings.Contains(string(r.body), `"outcome":"replayed"`) {
		t.Fatalf("discard of a replayed dead letter: %d %s, want its replay", r.status, r.body)
	}
	if p := letters(t, e, ""); len(p.DeadLetters) != 0 {
		t.Fatalf("dead letters left: %+v, want none", p.DeadLetters)
	}
	rep, err := e.c.Stores()[0].Verify(context.Background())
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v\n%s", err, rep.String())
	}
}
