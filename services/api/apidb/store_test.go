package apidb_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// bothSets are the migration sets of a region's database: the ledger's
// and the API's.
func bothSets() []pgdb.Migration { return append(postgres.Migrations(), apidb.Migrations()) }

// previousRelease is the ledger's migration set as the release before the
// move shipped it (testdata: 00003 and 00004 created the API's tables), up
// to version upTo.
func previousRelease(t *testing.T, upTo int) []pgdb.Migration {
	t.Helper()
	dir := os.DirFS("testdata/ledger-migrations-v6")
	files, err := fs.Glob(dir, "*.sql")
	if err != nil || len(files) != 6 {
		t.Fatalf("testdata: %v %v", files, err)
	}
	set := fstest.MapFS{}
	for _, name := range files {
		var v int
		if _, err := fmt.Sscanf(name, "%05d_", &v); err != nil {
			t.Fatal(err)
		}
		if v > upTo {
			continue
		}
		b, err := fs.ReadFile(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		set[name] = &fstest.MapFile{Data: b}
	}
	return []pgdb.Migration{{FS: dedup.Migrations(), Table: dedup.MigrationTable}, {FS: set, Table: "ledger_schema_version"}}
}

// schema describes the API's tables: columns, constraints and indexes.
func schema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT table_name || '.' || column_name || ' ' || data_type || ' null=' || is_nullable || ' default=' || coalesce(column_default, '-') ||
		        ' collation=' || coalesce(collation_name, '-')
		 FROM information_schema.columns WHERE table_name IN ('clients', 'idempotency_keys') ORDER BY 1`,
		`SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		 FROM pg_constraint WHERE conrelid IN ('clients'::regclass, 'idempotency_keys'::regclass) ORDER BY 1`,
		`SELECT indexdef FROM pg_indexes WHERE tablename IN ('clients', 'idempotency_keys') ORDER BY 1`,
	} {
		rows, err := pool.Query(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			b.WriteString(line + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

func version(t *testing.T, pool *pgxpool.Pool, table string) int64 {
	t.Helper()
	var v int64
	if err := pool.QueryRow(context.Background(), `SELECT max(version_id) FROM `+table).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMigrations: the API's tables come out the same on a fresh database
// (whichever set runs first) and on one migrated by the release before the
// move (whose ledger set created them in 00003 and 00004, at either
// version): the API's set adopts them with their rows, and the ledger's set
// keeps its version history.
func TestMigrations(t *testing.T) {
	ctx := context.Background()
	fresh, _ := pgtest.MustDatabase(t, bothSets()...)
	want := schema(t, fresh)
	if !strings.Contains(want, "clients.max_overdraft bigint null=NO default=0") || !strings.Contains(want, "idempotency_keys_expiry") ||
		!strings.Contains(want, "clients.role text null=NO default='client'::text") || !strings.Contains(want, "role = ANY (ARRAY['client'::text, 'operator'::text])") {
		t.Fatalf("fresh schema lacks the API's tables:\n%s", want)
	}
	for _, tc := range []struct {
		name   string
		before []pgdb.Migration // run first, then a client and a key are stored
		after  []pgdb.Migration
	}{
		{"FreshAPIFirst", nil, []pgdb.Migration{apidb.Migrations(), postgres.Migrations()[0], postgres.Migrations()[1]}},
		{"PreviousRelease", previousRelease(t, 6), bothSets()},
		{"BeforeOverdraft", previousRelease(t, 3), bothSets()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, _ := pgtest.MustDatabase(t, tc.before...)
			old := tc.before != nil
			if old {
				if _, err := pool.Exec(ctx, `INSERT INTO clients (id, name, key_hash) VALUES ('acme', 'Acme', $1)`, api.HashKey("acme-key-0123456789")); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (client_id, key, fingerprint, transfer_id, state, lease_until,
					response_status, response_body, response_final, created_at, expires_at)
					VALUES ('acme', 'k1', 'fp', 'eu-t1', 'done', now(), 201, '{"id":"eu-t1"}', true, now(), now() + interval '1 day')`); err != nil {
					t.Fatal(err)
				}
			}
			if err := pgdb.Migrate(ctx, pool, tc.after...); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			if got := schema(t, pool); got != want {
				t.Fatalf("schema:\n%s\nwant (fresh):\n%s", got, want)
			}
			if v, want := version(t, pool, "ledger_schema_version"), lastVersion(t, postgres.Migrations()[1]); v != want {
				t.Errorf("ledger version %d, want %d (its last migration)", v, want)
			}
			if v, want := version(t, pool, apidb.MigrationTable), lastVersion(t, apidb.Migrations()); v != want {
				t.Errorf("API version %d, want %d (its last migration)", v, want)
			}
			store := apidb.New(pool)
			if old {
				c, ok, err := store.ClientByKey(ctx, api.HashKey("acme-key-0123456789"))
				if err != nil || !ok || c.ID != "acme" || c.MaxOverdraft != 0 || c.Role != api.RoleClient {
					t.Fatalf("adopted client: got %+v %v %v, want client acme with no overdraft", c, ok, err)
				}
				k, ok, err := store.Key(ctx, "acme", "k1")
				if err != nil || !ok || k.Status != http.StatusCreated || string(k.Body) != `{"id":"eu-t1"}` {
					t.Fatalf("adopted key: got %+v %v %v", k, ok, err)
				}
			}
			if err := store.PutClient(ctx, api.RegisteredClient{ID: "beta", MaxOverdraft: 50}, "beta-key-0123456789"); err != nil {
				t.Fatalf("put a client after the migration: %v", err)
			}
		})
	}
}

// TestOperatorRole: an operator is stored and read back in its role; an
// id keeps its role (a client cannot be turned into an operator, nor the
// reverse, and the refused write changes nothing); an operator has no
// overdraft and an unknown role is refused.
func TestOperatorRole(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.MustDatabase(t, bothSets()...)
	store := apidb.New(pool)
	if err := store.PutClient(ctx, api.RegisteredClient{ID: "alice", Name: "Alice", Role: api.RoleOperator}, "alice-key-0123456789"); err != nil {
		t.Fatal(err)
	}
	if err := store.PutClient(ctx, api.RegisteredClient{ID: "acme", MaxOverdraft: 10}, "acme-key-0123456789"); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := store.ClientByKey(ctx, api.HashKey("alice-key-0123456789")); err != nil || !ok || c.ID != "alice" || c.Role != api.RoleOperator {
		t.Fatalf("operator: got %+v %v %v, want alice as operator", c, ok, err)
	}
	if c, ok, err := store.ClientByID(ctx, "acme"); err != nil || !ok || c.Role != api.RoleClient {
		t.Fatalf("client: got %+v %v %v, want acme as client", c, ok, err)
	}
	// A new key for the operator, in its role: allowed.
	if err := store.PutClient(ctx, api.RegisteredClient{ID: "alice", Role: api.RoleOperator}, "alice-key-2-0123456789"); err != nil {
		t.Fatalf("operator's new key: %v", err)
	}
	for _, tc := range []struct {
		name string
		c    api.RegisteredClient
		key  string
		want string
	}{
		{"ClientToOperator", api.RegisteredClient{ID: "acme", Role: api.RoleOperator}, "acme-key-2-0123456789", "acme is not registered as operator"},
		{"OperatorToClient", api.RegisteredClient{ID: "alice"}, "alice-key-3-0123456789", "alice is not registered as client"},
		{"OperatorOverdraft", api.RegisteredClient{ID: "bob", Role: api.RoleOperator, MaxOverdraft: 5}, "bob-key-0123456789", "operators move no money"},
		{"UnknownRole", api.RegisteredClient{ID: "bob", Role: "admin"}, "bob-key-0123456789", `unknown role "admin"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := store.PutClient(ctx, tc.c, tc.key)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if _, ok, _ := store.ClientByKey(ctx, api.HashKey(tc.key)); ok {
				t.Fatal("the refused key authenticates")
			}
		})
	}
	if err := store.PutClient(ctx, api.RegisteredClient{ID: "acme", Role: api.RoleOperator}, "x-key-0123456789"); !errors.Is(err, apidb.ErrRoleTaken) {
		t.Fatalf("client to operator: got %v, want ErrRoleTaken", err)
	}
	if c, _, _ := store.ClientByID(ctx, "acme"); c.Role != api.RoleClient || c.MaxOverdraft != 10 {
		t.Fatalf("acme after the refused writes: got %+v, want the client as it was", c)
	}
	if c, _, _ := store.ClientByKey(ctx, api.HashKey("alice-key-2-0123456789")); c.ID != "alice" || c.Role != api.RoleOperator {
		t.Fatalf("alice after the refused writes: got %+v, want the operator with its second key", c)
	}
}

// fixture is a region's database with both sets, its ledger (recording
// first answers through apidb.Answers) and the API's store.
func fixture(t *testing.T) (*ledgertest.Fixture, *apidb.Store) {
	t.Helper()
	pool, url := pgtest.MustDatabase(t, bothSets()...)
	f := ledgertest.On(t, pool, url, func(c *postgres.Config) { c.Answers = apidb.Answers{} })
	return f, apidb.New(pool)
}

// TestStartKey: the first step of a transfer request claims a new key only
// for the client's own source account, leaves an existing key to
// ResolveKey, and reads the transfer the client's key already made.
func TestStartKey(t *testing.T) {
	f, store := fixture(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	start := func(client, key, source, id string) api.KeyStart {
		t.Helper()
		st, err := store.StartKey(ctx, api.KeyClaim{Client: client, Key: key, Fingerprint: []byte("fp"), TransferID: id,
			Now: f.Clock.Now(), Lease: time.Minute, TTL: time.Hour}, source)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	st := start("c1", "k1", a, "eu-t1")
	if !st.SourceFound || st.Source.ID != a || !st.Claimed || st.Key.TransferID != "eu-t1" || !st.Key.InFlight || st.Prior.ID != "" {
		t.Fatalf("a new key on an own account: %+v", st)
	}
	if st := start("c1", "k1", a, "eu-t2"); st.Claimed {
		t.Fatalf("an existing key was claimed again: %+v", st)
	}
	if st := start("c2", "k2", a, "eu-t3"); st.Claimed || !st.SourceFound || st.Source.ClientID != "c1" {
		t.Fatalf("another client's account: %+v", st)
	}
	if st := start("c1", "k3", "eu-nosuchaccount", "eu-t4"); st.Claimed || st.SourceFound {
		t.Fatalf("a missing account: %+v", st)
	}
	if n := f.Count(t, `SELECT count(*) FROM idempotency_keys`); n != 1 {
		t.Fatalf("%d keys, want only k1", n)
	}
	// A key whose transfer exists (its idempotency key expired and went).
	cmd := f.Transfer(t, a, b, 10)
	f.MustApply(t, cmd)
	if st := start("c1", cmd.IdempotencyKey, a, "eu-t6"); !st.Claimed || st.Prior.ID != cmd.TransferID {
		t.Fatalf("a key whose transfer exists: %+v", st)
	}
	if tr, ok, err := store.TransferByKey(ctx, "c1", cmd.IdempotencyKey); err != nil || !ok || tr.ID != cmd.TransferID {
		t.Fatalf("TransferByKey: got %s %v %v, want %s", tr.ID, ok, err, cmd.TransferID)
	}
	if _, ok, err := store.TransferByKey(ctx, "c1", "no-such-key"); err != nil || ok {
		t.Fatalf("TransferByKey of an unused key: got %v %v, want none", ok, err)
	}
}

// TestStartKeyGroupCommit: concurrent StartKey calls commit their claims
// together, in fewer transactions than calls (the rows' xmin), and each
// call still gets its own outcome: a new key on an own account claimed,
// another client's account not, and of two calls with one key exactly one
// claimed.
func TestStartKeyGroupCommit(t *testing.T) {
	f, store := fixture(t)
	ctx := context.Background()
	a := f.Account(t, "EUR", 100)
	const n = 100
	sts := make([]api.KeyStart, n+2)
	errs := make([]error, n+2)
	var wg sync.WaitGroup
	for i := range n + 2 {
		client, key := "c1", fmt.Sprint("g", i)
		switch {
		case i%4 == 0:
			client = "c2" // a is c1's
		case i >= n:
			key = "same"
		}
		wg.Go(func() {
			sts[i], errs[i] = store.StartKey(ctx, api.KeyClaim{Client: client, Key: key, Fingerprint: []byte("fp"),
				TransferID: fmt.Sprint("eu-t", i), Now: f.Clock.Now(), Lease: time.Minute, TTL: time.Hour}, a)
		})
	}
	wg.Wait()
	same := 0
	for i, st := range sts {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		switch {
		case i >= n:
			if st.Claimed {
				same++
			}
		case i%4 == 0:
			if st.Claimed || !st.SourceFound {
				t.Fatalf("call %d, another client's account: %+v", i, st)
			}
		case !st.Claimed || st.Key.TransferID != fmt.Sprint("eu-t", i):
			t.Fatalf("call %d, a new key: %+v", i, st)
		}
	}
	if same != 1 {
		t.Fatalf("two calls with one key: %d claimed it, want 1", same)
	}
	claimed := f.Count(t, `SELECT count(*) FROM idempotency_keys`)
	if want := n - n/4 + 1; claimed != want {
		t.Fatalf("%d keys claimed, want %d", claimed, want)
	}
	commits := f.Count(t, `SELECT count(DISTINCT xmin::text) FROM idempotency_keys`)
	t.Logf("%d claims in %d commits", claimed, commits)
	if commits > claimed/2 {
		t.Fatalf("%d claims took %d commits, want them grouped", claimed, commits)
	}
}

// TestAnswers: the ledger's apply transaction stores the API's rendering of
// a request's result with its in-flight key, final unless a 202; a key
// already answered (by the API) keeps its answer; a saga step answers
// nothing.
func TestAnswers(t *testing.T) {
	f, store := fixture(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	claim := func(cmd ledger.Command) {
		t.Helper()
		if _, out, err := store.BeginKey(ctx, api.KeyClaim{Client: cmd.ClientID, Key: cmd.IdempotencyKey, Fingerprint: cmd.Fingerprint(),
			TransferID: cmd.TransferID, Now: f.Clock.Now(), Lease: time.Minute, TTL: time.Hour}); err != nil || out != api.KeyNew {
			t.Fatalf("claim: %v %v", out, err)
		}
	}
	ok, over, answered := f.Transfer(t, a, b, 30), f.Transfer(t, a, b, 1000), f.Transfer(t, a, b, 5)
	for _, c := range []ledger.Command{ok, over, answered} {
		claim(c)
	}
	if _, err := store.Answer(ctx, "c1", answered.IdempotencyKey, http.StatusAccepted, []byte(`{"by":"api"}`), false); err != nil {
		t.Fatal(err)
	}
	results := f.Apply(t, ok, over, answered)
	for i, c := range []ledger.Command{ok, over} {
		k, found, err := store.Key(ctx, "c1", c.IdempotencyKey)
		if err != nil || !found {
			t.Fatalf("key %s: %v %v", c.IdempotencyKey, found, err)
		}
		status, body := api.Respond(results[i])
		if k.InFlight || !k.Final || k.Status != status || !bytes.Equal(k.Body, body) {
			t.Errorf("key of %s: got %d %s (in flight %v, final %v), want final %d %s", c.TransferID, k.Status, k.Body, k.InFlight, k.Final, status, body)
		}
		// What the consumer sends the waiting API: the answer as stored.
		if an := results[i].Answer; an == nil || an.Status != k.Status || !bytes.Equal(an.Body, k.Body) {
			t.Errorf("result of %s carries answer %+v, want the stored %d %s", c.TransferID, an, k.Status, k.Body)
		}
	}
	if k, _, _ := store.Key(ctx, "c1", answered.IdempotencyKey); k.Status != http.StatusAccepted || string(k.Body) != `{"by":"api"}` {
		t.Errorf("a key the API answered first: got %d %s, want its own answer kept", k.Status, k.Body)
	}
	if an := results[2].Answer; an != nil {
		t.Errorf("a key the API answered first: the result carries %d %s, an answer the batch did not store", an.Status, an.Body)
	}
}

// TestBeginKeyOutcomeUnknown cuts the connection while a new idempotency
// key's insert is in flight (the trap is on its transfer ID, which only the
// insert carries): once before the server ran it, once after it ran and
// committed with the answer lost. Either way the caller gets the key as
// new, with its own transfer ID: not a 409 for a key it holds itself.
func TestBeginKeyOutcomeUnknown(t *testing.T) {
	for _, mode := range []faultproxy.Mode{faultproxy.DropAfter, faultproxy.DropBefore} {
		name := map[faultproxy.Mode]string{faultproxy.DropAfter: "InsertedThenCut", faultproxy.DropBefore: "CutBeforeInsert"}[mode]
		t.Run(name, func(t *testing.T) {
			store, proxy := proxiedStore(t)
			ctx := context.Background()
			now := time.Now()
			c := api.KeyClaim{Client: "c1", Key: "k1", Fingerprint: []byte("fp"), TransferID: "eu-transfer-1", Now: now, Lease: time.Minute, TTL: time.Hour}
			proxy.Trap([]byte("eu-transfer-1"), mode)
			k, out, err := store.BeginKey(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if proxy.Fired() != 1 {
				t.Fatalf("the fault did not fire")
			}
			if out != api.KeyNew || k.TransferID != "eu-transfer-1" {
				t.Fatalf("got %v with transfer %q, want a new key with eu-transfer-1", out, k.TransferID)
			}
			// The key is held: another request with it is told so.
			c.TransferID = "eu-transfer-2"
			if _, out, err := store.BeginKey(ctx, c); err != nil || out != api.KeyInFlight {
				t.Fatalf("a second request: got %v, %v; want in flight", out, err)
			}
		})
	}
}

// proxiedStore is an API store whose every connection runs through a fault
// proxy in front of the test server.
func proxiedStore(t *testing.T) (*apidb.Store, *faultproxy.Proxy) {
	t.Helper()
	_, url := pgtest.MustDatabase(t, apidb.Migrations())
	proxy, err := faultproxy.New("127.0.0.1:5432")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	addr := proxy.Addr()
	var port uint16
	if _, err := fmt.Sscanf(addr[strings.LastIndex(addr, ":")+1:], "%d", &port); err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", port
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return apidb.New(pool), proxy
}

// TestAnswersUnclaimed: for a request whose key the API did not claim
// (KeyExpiresAt set), the apply transaction makes the key's row with the
// answer, the request's fingerprint and transfer, kept until KeyExpiresAt;
// a second request of one key in the batch adds nothing (one row, the
// first's); a key answered before keeps its answer; an expired key is
// taken over, and so is a 202 that names a transfer which never came to
// be (an earlier attempt of the key took it); the result carries exactly
// what was stored.
func TestAnswersUnclaimed(t *testing.T) {
	f, store := fixture(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	unclaimed := func(c ledger.Command) ledger.Command {
		c.KeyExpiresAt = c.CreatedAt.Add(time.Hour)
		return c
	}
	fresh, kept, expired, phantom := unclaimed(f.Transfer(t, a, b, 10)), unclaimed(f.Transfer(t, a, b, 20)),
		unclaimed(f.Transfer(t, a, b, 30)), unclaimed(f.Transfer(t, a, b, 40))
	twin := fresh
	twin.TransferID = f.ID(t)
	for _, c := range []struct {
		cmd     ledger.Command
		status  int
		expires time.Time
	}{
		{kept, http.StatusCreated, f.Clock.Now().Add(time.Hour)},
		{expired, http.StatusAccepted, f.Clock.Now().Add(-time.Minute)},
		{phantom, http.StatusAccepted, f.Clock.Now().Add(time.Hour)},
	} {
		since := f.Clock.Now().Add(-2 * time.Hour)
		claim := api.KeyClaim{Client: c.cmd.ClientID, Key: c.cmd.IdempotencyKey, Fingerprint: []byte("before"), TransferID: "eu-before",
			Now: since, TTL: c.expires.Sub(since)}
		if _, err := store.AnswerUnclaimed(ctx, claim, c.status, []byte(`{"by":"before"}`)); err != nil {
			t.Fatal(err)
		}
	}
	results := f.Apply(t, fresh, twin, kept, expired, phantom)
	for _, i := range []int{0, 3, 4} {
		c := []ledger.Command{fresh, twin, kept, expired, phantom}[i]
		k, found, err := store.Key(ctx, c.ClientID, c.IdempotencyKey)
		status, body := api.Respond(results[i])
		if err != nil || !found || k.InFlight || !k.Final || k.Status != status || !bytes.Equal(k.Body, body) ||
			k.TransferID != c.TransferID || !bytes.Equal(k.Fingerprint, api.RequestFingerprint(c)) || k.ExpiresAt.Sub(c.KeyExpiresAt).Abs() > time.Microsecond {
			t.Errorf("key of %s: %+v (found %v, %v), want the answer %d %s made by the batch", c.TransferID, k, found, err, status, body)
		}
		if an := results[i].Answer; an == nil || an.Status != k.Status || !bytes.Equal(an.Body, k.Body) {
			t.Errorf("result of %s carries %+v, want the stored answer", c.TransferID, an)
		}
	}
	if an := results[1].Answer; an != nil {
		t.Errorf("the second request of one key carries answer %d %s", an.Status, an.Body)
	}
	if k, _, _ := store.Key(ctx, kept.ClientID, kept.IdempotencyKey); k.Status != http.StatusCreated || string(k.Body) != `{"by":"before"}` {
		t.Errorf("a key answered before: %d %s, want its answer kept", k.Status, k.Body)
	}
	if an := results[2].Answer; an != nil {
		t.Errorf("a key answered before: the result carries %d %s", an.Status, an.Body)
	}
}

// TestAnswerUnclaimed: the API's own answer for a request whose key it did
// not claim makes the key's row, or takes over an expired one; a row
// answered by another request, or in flight under another's claim, is
// returned as it is.
func TestAnswerUnclaimed(t *testing.T) {
	_, store := fixture(t)
	ctx := context.Background()
	now := time.Now()
	c := func(key, tid string, fp string) api.KeyClaim {
		return api.KeyClaim{Client: "c1", Key: key, Fingerprint: []byte(fp), TransferID: tid, Now: now, Lease: time.Minute, TTL: time.Hour}
	}
	k, err := store.AnswerUnclaimed(ctx, c("new", "eu-1", "fp"), http.StatusAccepted, []byte(`{"id":"eu-1"}`))
	if err != nil || k.InFlight || !k.Final || k.TransferID != "eu-1" || k.Status != http.StatusAccepted {
		t.Fatalf("a new key: %+v %v", k, err)
	}
	if k, err = store.AnswerUnclaimed(ctx, c("new", "eu-2", "other"), http.StatusAccepted, []byte(`{"id":"eu-2"}`)); err != nil ||
		k.TransferID != "eu-1" || string(k.Fingerprint) != "fp" || string(k.Body) != `{"id":"eu-1"}` {
		t.Fatalf("an answered key: %+v %v, want it as it was", k, err)
	}
	if _, out, err := store.BeginKey(ctx, c("claimed", "eu-3", "fp")); err != nil || out != api.KeyNew {
		t.Fatalf("claim: %v %v", out, err)
	}
	if k, err = store.AnswerUnclaimed(ctx, c("claimed", "eu-4", "fp"), http.StatusAccepted, []byte(`{"id":"eu-4"}`)); err != nil ||
		!k.InFlight || k.TransferID != "eu-3" {
		t.Fatalf("a key in flight under another's claim: %+v %v, want it untouched", k, err)
	}
	old := c("old", "eu-5", "fp")
	old.Now, old.TTL = now.Add(-2*time.Hour), time.Hour
	if _, err := store.AnswerUnclaimed(ctx, old, http.StatusCreated, []byte(`{"id":"eu-5"}`)); err != nil {
		t.Fatal(err)
	}
	if k, err = store.AnswerUnclaimed(ctx, c("old", "eu-6", "new"), http.StatusAccepted, []byte(`{"id":"eu-6"}`)); err != nil ||
		k.TransferID != "eu-6" || string(k.Fingerprint) != "new" || !k.ExpiresAt.After(now) {
		t.Fatalf("an expired key: %+v %v, want it taken over", k, err)
	}
}

// TestCheckAccounts: the unclaimed path's read gives StartKey's account
// outcomes (the source with its owner, a missing source, a missing
// destination here) and writes nothing, alone or in a group with claims.
func TestCheckAccounts(t *testing.T) {
	f, store := fixture(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	claim := func(key, dest string) api.KeyClaim {
		return api.KeyClaim{Client: "c1", Key: key, Fingerprint: []byte("fp"), TransferID: "eu-" + key, Destination: dest,
			Now: f.Clock.Now(), Lease: time.Minute, TTL: time.Hour}
	}
	var wg sync.WaitGroup
	sts := make([]api.KeyStart, 4)
	errs := make([]error, 4)
	for i, c := range []struct {
		claim  api.KeyClaim
		source string
		start  bool
	}{{claim("own", b), a, false}, {claim("nodest", "eu-nosuchaccount"), a, false}, {claim("nosource", ""), "eu-nosuchaccount", false}, {claim("claimed", b), a, true}} {
		wg.Go(func() {
			if c.start {
				sts[i], errs[i] = store.StartKey(ctx, c.claim, c.source)
			} else {
				sts[i], errs[i] = store.CheckAccounts(ctx, c.claim, c.source)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := sts[0]; !st.SourceFound || st.Source.ID != a || st.Source.ClientID != "c1" || st.DestinationMissing || st.Claimed {
		t.Errorf("own account, destination here: %+v", st)
	}
	if st := sts[1]; !st.SourceFound || !st.DestinationMissing || st.Claimed {
		t.Errorf("missing destination: %+v", st)
	}
	if st := sts[2]; st.SourceFound || st.Claimed {
		t.Errorf("missing source: %+v", st)
	}
	if st := sts[3]; !st.Claimed {
		t.Errorf("the StartKey call of the group: %+v", st)
	}
	if n := f.Count(t, `SELECT count(*) FROM idempotency_keys`); n != 1 {
		t.Fatalf("%d keys, want only the StartKey call's", n)
	}
}

// lastVersion is the number of a set's last migration file (00005_x.sql:
// 5), the version its table records once the set has run.
func lastVersion(t *testing.T, m pgdb.Migration) int64 {
	t.Helper()
	files, err := fs.Glob(m.FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: migration files %v %v", m.Table, files, err)
	}
	n, err := strconv.ParseInt(strings.SplitN(path.Base(files[len(files)-1]), "_", 2)[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
