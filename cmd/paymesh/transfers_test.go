package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// runCLI runs paymesh with args as main does, and returns what it printed
// on stdout.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var c cli
	k, err := kong.New(&c, kong.Name("paymesh"), cliVars)
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := k.Parse(args)
	if err != nil {
		return "", err
	}
	tab, ids := defaultRegions(t)
	kctx.BindTo(context.Background(), (*context.Context)(nil))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() { b, _ := io.ReadAll(r); out <- string(b) }()
	err = kctx.Run(tab, ids, slog.New(slog.DiscardHandler))
	os.Stdout = stdout
	w.Close()
	return <-out, err
}

// openAccount opens an EUR account with paymesh accounts create and
// returns its ID.
func openAccount(t *testing.T, flags []string) string {
	t.Helper()
	out, err := runCLI(t, append([]string{"accounts", "create", "--currency", "EUR"}, flags...)...)
	var a api.AccountBody
	if err != nil || json.Unmarshal([]byte(out), &a) != nil {
		t.Fatalf("accounts create: %v %s", err, out)
	}
	return a.ID
}

// fundAccount submits an operator's funding of amount EUR to account in
// region.
func fundAccount(t *testing.T, c *cluster.Cluster, region, account string, amount int64) {
	t.Helper()
	gen, err := idgen.NewGenerator(c.IDs(), region, 901)
	if err != nil {
		t.Fatal(err)
	}
	fid, err := gen.NextString()
	if err != nil {
		t.Fatal(err)
	}
	fund := ledger.Command{Type: ledger.TypeFund, TransferID: fid, ClientID: "ops", IdempotencyKey: "fund-" + account,
		To: account, Amount: amount, Currency: "EUR", CreatedAt: time.Now()}
	if err := c.Submit(context.Background(), region, fund); err != nil {
		t.Fatal(err)
	}
}

// TestTransfersCommands: paymesh transfers send --hold, capture, void and
// refund against a running region, each printing the API's answer; a
// refused one exits with the failure and prints the problem; bad flags are
// refused before anything is sent.
func TestTransfersCommands(t *testing.T) {
	ctx := context.Background()
	topo := natsembed.MustStartTopology(t, "eu")
	c, err := cluster.Start(ctx, cluster.Config{Regions: map[string]uint8{"eu": 1}, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_cli_%d_", os.Getpid()), Shards: 2, BatchSize: 64, AckWait: 2 * time.Second,
		APIWait: 3 * time.Second, KeyTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	const key = "pm_cli_test_0123456789abcdef"
	if err := c.Region("eu").APIStore.PutClient(ctx, api.RegisteredClient{ID: "cli", Name: "cli"}, key); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--api-url", c.Region("eu").APIURL, "--api-key", key}
	a, b := openAccount(t, flags), openAccount(t, flags)
	fundAccount(t, c, "eu", a, 1000)
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitQuiet(qctx); err != nil {
		t.Fatal(err)
	}
	transfer := func(args ...string) api.TransferBody {
		t.Helper()
		out, err := runCLI(t, append(args, flags...)...)
		var x api.TransferBody
		if err != nil || json.Unmarshal([]byte(out), &x) != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
		return x
	}
	h := transfer("transfers", "send", "--from", a, "--to", b, "--amount", "400", "--currency", "EUR", "--hold", "--expires", "1h")
	if h.Status != string(ledger.StatusHeld) || h.ExpiresAt == nil || time.Until(*h.ExpiresAt) < 50*time.Minute {
		t.Fatalf("send --hold: %+v", h)
	}
	if got := transfer("transfers", "capture", h.ID, "--amount", "300", "--key", "cap-1"); got.Status != string(ledger.StatusCompleted) || *got.CapturedAmount != 300 {
		t.Fatalf("capture: %+v", got)
	}
	out, err := runCLI(t, append([]string{"transfers", "void", h.ID}, flags...)...)
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeTransferNotHeld)) {
		t.Fatalf("void after capture: %v %s, want the failure and transfer_not_held", err, out)
	}
	v := transfer("transfers", "send", "--from", a, "--to", b, "--amount", "100", "--currency", "EUR", "--hold")
	if got := transfer("transfers", "void", v.ID); got.Status != string(ledger.StatusVoided) {
		t.Fatalf("void: %+v", got)
	}
	if got := transfer("transfers", "refund", h.ID, "--amount", "100"); got.RefundOf != h.ID || got.Amount != 100 {
		t.Fatalf("refund: %+v", got)
	}
	if got := transfer("transfers", "refund", h.ID); got.Amount != 200 {
		t.Fatalf("refund of the rest: %+v", got)
	}
	out, err = runCLI(t, append([]string{"transfers", "refund", h.ID}, flags...)...)
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeRefundExceedsCaptured)) {
		t.Fatalf("refund of nothing left: %v %s", err, out)
	}
	for name, args := range map[string][]string{
		"expires without hold": {"transfers", "send", "--from", a, "--to", b, "--amount", "1", "--currency", "EUR", "--expires", "1h"},
		"bad expiry":           {"transfers", "send", "--from", a, "--to", b, "--amount", "1", "--currency", "EUR", "--hold", "--expires", "soon"},
		"zero capture":         {"transfers", "capture", h.ID, "--amount", "0"},
		"fraction":             {"transfers", "refund", h.ID, "--amount", "1.5"},
	} {
		if _, err := runCLI(t, append(args, flags...)...); err == nil || errors.Is(err, errFailed) {
			t.Errorf("%s: got %v, want a flag error before sending", name, err)
		}
	}
	if acc := func() api.AccountBody {
		out, _ := runCLI(t, append([]string{"accounts", "show", a}, flags...)...)
		var x api.AccountBody
		_ = json.Unmarshal([]byte(out), &x)
		return x
	}(); acc.Balance != 1000 || acc.Held != 0 {
		t.Fatalf("source: %+v, want 1000 held 0 (300 captured, 300 refunded)", acc)
	}

	// The balance at an instant, and the statement since the funding.
	out, err = runCLI(t, append([]string{"accounts", "show", a, "--as-of", time.Now().UTC().Format(time.RFC3339Nano)}, flags...)...)
	var asOf api.AccountAsOfBody
	if err != nil || json.Unmarshal([]byte(out), &asOf) != nil || asOf.Balance != 1000 || asOf.Version == 0 {
		t.Fatalf("accounts show --as-of now: %v %s, want balance 1000", err, out)
	}
	out, err = runCLI(t, append([]string{"accounts", "statement", a, "--from", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)}, flags...)...)
	var st api.StatementBody
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.OpeningBalance != 0 || st.ClosingBalance != 1000 || len(st.Entries) == 0 {
		t.Fatalf("accounts statement: %v %s, want 0 to 1000 with its entries", err, out)
	}
	out, err = runCLI(t, append([]string{"accounts", "statement", a, "--from", "last week"}, flags...)...)
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeInvalidRequest)) {
		t.Fatalf("accounts statement --from 'last week': %v %s, want the API's 400", err, out)
	}
	// The lists: the completed transfers from a, and the client's accounts.
	out, err = runCLI(t, append([]string{"transfers", "list", "--account", a, "--status", "COMPLETED", "--limit", "50"}, flags...)...)
	var tl api.TransferList
	if err != nil || json.Unmarshal([]byte(out), &tl) != nil || len(tl.Transfers) == 0 {
		t.Fatalf("transfers list: %v %s", err, out)
	}
	for _, x := range tl.Transfers {
		if x.Status != string(ledger.StatusCompleted) || x.From != a && x.To != a {
			t.Fatalf("transfers list --account --status: %+v", x)
		}
	}
	out, err = runCLI(t, append([]string{"accounts", "list", "--limit", "1"}, flags...)...)
	var al api.AccountList
	if err != nil || json.Unmarshal([]byte(out), &al) != nil || len(al.Accounts) != 1 || al.NextCursor == "" {
		t.Fatalf("accounts list --limit 1: %v %s, want one account and a cursor", err, out)
	}
	out, err = runCLI(t, append([]string{"transfers", "list", "--status", "DONE"}, flags...)...)
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeInvalidRequest)) {
		t.Fatalf("transfers list --status DONE: %v %s, want the API's 400", err, out)
	}
	// The event feed: the captures of the client's holds, then a type
	// that is none.
	// The feed shows a commit once no older write transaction of the
	// database is running: wait for it.
	var el api.EventList
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		out, err = runCLI(t, append([]string{"events", "list", "--type", "transfer.captured,transfer.voided", "--limit", "50"}, flags...)...)
		if err != nil || json.Unmarshal([]byte(out), &el) != nil || el.NextCursor == "" {
			t.Fatalf("events list --type: %v %s, want the captures and a cursor", err, out)
		}
		if len(el.Events) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events list --type: %s after a minute, want the captures", out)
		}
	}
	for _, x := range el.Events {
		if x.Type != "transfer.captured" && x.Type != "transfer.voided" || x.Data.Transfer == nil {
			t.Fatalf("events list --type transfer.captured,transfer.voided: %+v", x)
		}
	}
	out, err = runCLI(t, append([]string{"events", "list", "--type", "transfer.teleported"}, flags...)...)
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeInvalidRequest)) {
		t.Fatalf("events list --type transfer.teleported: %v %s, want the API's 400", err, out)
	}
	// A reference and metadata: kept, listed by, and the reference taken.
	paid := transfer("transfers", "send", "--from", a, "--to", b, "--amount", "1", "--currency", "EUR",
		"--reference", "cli-order-1", "--metadata", "shop=north", "--metadata", "till=7")
	if paid.Reference != "cli-order-1" || paid.Metadata["shop"] != "north" || paid.Metadata["till"] != "7" {
		t.Fatalf("send --reference --metadata: %+v", paid)
	}
	out, err = runCLI(t, append([]string{"transfers", "send", "--from", a, "--to", b, "--amount", "1", "--currency", "EUR", "--reference", "cli-order-1"}, flags...)...)
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeReferenceInUse)) || !strings.Contains(out, paid.ID) {
		t.Fatalf("the reference again: %v %s, want reference_in_use naming %s", err, out, paid.ID)
	}
	for _, args := range [][]string{{"--reference", "cli-order-1", "--status", "COMPLETED"}, {"--metadata", "shop=north;till=7"}} {
		out, err = runCLI(t, append(append([]string{"transfers", "list"}, args...), flags...)...)
		tl = api.TransferList{}
		if err != nil || json.Unmarshal([]byte(out), &tl) != nil || len(tl.Transfers) != 1 || tl.Transfers[0].ID != paid.ID {
			t.Fatalf("transfers list %v: %v %s, want %s", args, err, out, paid.ID)
		}
	}
	// Opening an account under a key: a retry is the same account.
	one, _ := runCLI(t, append([]string{"accounts", "create", "--currency", "EUR", "--key", "cli-open-1"}, flags...)...)
	two, _ := runCLI(t, append([]string{"accounts", "create", "--currency", "EUR", "--key", "cli-open-1"}, flags...)...)
	if one == "" || one != two {
		t.Fatalf("accounts create --key twice: %s and %s, want one answer", one, two)
	}
	// Freeze, unfreeze and close the empty account; a second close is the API's 422.
	var opened api.AccountBody
	_ = json.Unmarshal([]byte(one), &opened)
	for _, step := range []struct {
		op             string
		frozen, closed bool
	}{{"freeze", true, false}, {"unfreeze", false, false}, {"close", false, true}} {
		out, err := runCLI(t, append([]string{"accounts", step.op, opened.ID, "--key", "cli-" + step.op}, flags...)...)
		var got api.AccountBody
		if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.Frozen != step.frozen || got.Closed != step.closed {
			t.Fatalf("accounts %s: %v %s, want frozen %v closed %v", step.op, err, out, step.frozen, step.closed)
		}
	}
	out, err = runCLI(t, append([]string{"accounts", "close", opened.ID}, flags...)...)
	if !errors.Is(err, errFailed) || !strings.Contains(out, string(ledger.CodeAccountClosed)) {
		t.Fatalf("accounts close of a closed account: %v %s, want the API's account_closed", err, out)
	}
}
