package postgres

import (
	"fmt"
	"testing"
	"time"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
)

// TestClassify decides the fate of the last command of each case's batch,
// without a database: what the claim answered and what the claim stage
// read are given.
func TestClassify(t *testing.T) {
	now := time.Now()
	req := func(id, key string) ledger.Command {
		return ledger.Command{Type: ledger.TypeTransfer, TransferID: id, ClientID: "c1", IdempotencyKey: key,
			From: "eu-a", To: "eu-b", Amount: 10, Currency: "EUR", CreatedAt: now}
	}
	step := func(typ, id string) ledger.Command { return req(id, "k-"+id).Step(typ, "") }
	claim := func(c ledger.Command, o dedup.Outcome, l dedup.Layer) dedup.Claim {
		return dedup.Claim{Key: dedup.Key{ID: c.MsgKey(), Origin: now, Fingerprint: c.Fingerprint()}, Outcome: o, Layer: l}
	}
	first := func(c ledger.Command) dedup.Claim { return claim(c, dedup.First, "") }
	made := func(c ledger.Command, reason ledger.Code) ledger.Transfer {
		return ledger.Transfer{ID: c.TransferID, ClientID: c.ClientID, IdempotencyKey: c.IdempotencyKey, Fingerprint: c.Fingerprint(), Reason: reason}
	}
	knowing := func(ts ...ledger.Transfer) knownTransfers {
		k := knownTransfers{byKey: map[string]ledger.Transfer{}, byID: map[string]bool{}}
		for _, t := range ts {
			k.byKey[requestOf(t).MsgKey()], k.byID[t.ID] = t, true
		}
		return k
	}
	promising := func(k knownTransfers, cs ...ledger.Command) knownTransfers {
		k.promised = map[string]bool{}
		for _, c := range cs {
			k.promised[c.MsgKey()] = true
		}
		return k
	}
	x := req("eu-x", "k1")
	other := req("eu-x", "k1") // the same key and transfer ID, another body
	other.Amount = 99

	cases := []struct {
		name     string
		cmds     []ledger.Command
		claims   []dedup.Claim
		known    knownTransfers
		credited map[string]bool
		want     string // the last command's fate and result
	}{
		{name: "ApplyNewRequest", cmds: []ledger.Command{x}, claims: []dedup.Claim{first(x)}, known: knowing(),
			want: "apply keep"},
		{name: "ApplyNewCredit", cmds: []ledger.Command{step(ledger.TypeCredit, "eu-c")}, claims: []dedup.Claim{first(step(ledger.TypeCredit, "eu-c"))},
			known: knowing(), credited: map[string]bool{"eu-other": true}, want: "apply keep"},
		{name: "ApplyConfirmStep", cmds: []ledger.Command{step(ledger.TypeConfirm, "eu-x")}, claims: []dedup.Claim{first(step(ledger.TypeConfirm, "eu-x"))},
			known: knowing(made(x, "")), want: "apply keep"},
		{name: "DuplicateRecentCache", cmds: []ledger.Command{x}, claims: []dedup.Claim{claim(x, dedup.Duplicate, dedup.LayerCache)},
			known: knowing(made(x, "")), want: "duplicate keep: duplicate/recent_cache transfer= dead=false err="},
		{name: "DuplicateConsumeLogReplaysTransfer", cmds: []ledger.Command{x}, claims: []dedup.Claim{claim(x, dedup.Duplicate, dedup.LayerTable)},
			known: knowing(made(x, "")), want: "duplicate keep: duplicate/dedup_table transfer=eu-x dead=false err="},
		{name: "DuplicateConsumeLogDeadLettersRefusal", cmds: []ledger.Command{x}, claims: []dedup.Claim{claim(x, dedup.Duplicate, dedup.LayerTable)},
			known: knowing(made(x, ledger.CodeAccountNotFound)), want: "duplicate keep: duplicate/dedup_table transfer=eu-x dead=true err=account_not_found"},
		{name: "DuplicateConsumeLogStep", cmds: []ledger.Command{step(ledger.TypeCredit, "eu-x")},
			claims: []dedup.Claim{claim(step(ledger.TypeCredit, "eu-x"), dedup.Duplicate, dedup.LayerTable)},
			known:  knowing(), want: "duplicate keep: duplicate/dedup_table transfer= dead=false err="},
		{name: "DuplicateBusinessKey", cmds: []ledger.Command{x}, claims: []dedup.Claim{first(x)}, known: knowing(made(x, "")),
			want: "duplicate release: duplicate/business_key transfer=eu-x dead=false err="},
		{name: "DuplicatePromisedKey", cmds: []ledger.Command{x}, claims: []dedup.Claim{first(x)},
			known: promising(knowing(), x), want: "duplicate release: duplicate/idempotency_key transfer= dead=false err="},
		{name: "DuplicateCreditRecorded", cmds: []ledger.Command{step(ledger.TypeCredit, "eu-x")}, claims: []dedup.Claim{first(step(ledger.TypeCredit, "eu-x"))},
			known: knowing(), credited: map[string]bool{"eu-x": true}, want: "duplicate release: duplicate/business_key transfer= dead=false err="},
		{name: "ConflictConsumeLog", cmds: []ledger.Command{other}, claims: []dedup.Claim{claim(other, dedup.Conflict, dedup.LayerTable)},
			known: knowing(made(x, "")), want: "conflict keep: conflict/dedup_table transfer= dead=true err=idempotency_key_reused"},
		{name: "ConflictBusinessKey", cmds: []ledger.Command{other}, claims: []dedup.Claim{first(other)}, known: knowing(made(x, "")),
			want: "conflict release: conflict/business_key transfer= dead=true err=idempotency_key_reused"},
		{name: "ReusedTransferID", cmds: []ledger.Command{req("eu-x", "k2")}, claims: []dedup.Claim{first(req("eu-x", "k2"))}, known: knowing(made(x, "")),
			want: "reused-id release: invalid/ transfer= dead=true err=transfer_id_reused"},
		{name: "ReusedTransferIDInBatch", cmds: []ledger.Command{x, req("eu-x", "k2")}, claims: []dedup.Claim{first(x), first(req("eu-x", "k2"))},
			known: knowing(), want: "reused-id release: invalid/ transfer= dead=true err=transfer_id_reused (in this batch)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fates := classify(tc.cmds, tc.claims, tc.known, tc.credited)
			if len(fates) != len(tc.cmds) {
				t.Fatalf("got %d fates, want %d", len(fates), len(tc.cmds))
			}
			last := len(fates) - 1
			if got := describeFate(fates[last], tc.cmds[last]); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// describeFate renders a fate and, unless it is fateApply, its result.
func describeFate(f fate, c ledger.Command) string {
	kind := map[fateKind]string{fateApply: "apply", fateDuplicate: "duplicate", fateConflict: "conflict", fateReusedID: "reused-id"}[f.kind]
	claim := map[bool]string{false: "keep", true: "release"}[f.release]
	if f.kind == fateApply {
		return kind + " " + claim
	}
	r := f.result(c)
	var code ledger.Code
	if r.Err != nil {
		code = r.Err.Code
	}
	s := fmt.Sprintf("%s %s: %v/%s transfer=%s dead=%v err=%s", kind, claim, r.Kind, r.Layer, r.Transfer.ID, r.DeadLetter, code)
	if f.inBatch {
		s += " (in this batch)"
	}
	return s
}

// TestSettledByClaims: a batch the claims settle writes nothing; a first
// claim, or a request the table caught (its response is stored), does.
func TestSettledByClaims(t *testing.T) {
	now := time.Now()
	x := ledger.Command{Type: ledger.TypeTransfer, TransferID: "eu-x", ClientID: "c1", IdempotencyKey: "k1", CreatedAt: now}
	credit := x.Step(ledger.TypeCredit, "")
	at := func(o dedup.Outcome, l dedup.Layer) []dedup.Claim { return []dedup.Claim{{Outcome: o, Layer: l}} }
	for _, tc := range []struct {
		name   string
		cmd    ledger.Command
		claims []dedup.Claim
		want   bool
	}{
		{"SettledRecentCache", x, at(dedup.Duplicate, dedup.LayerCache), true},
		{"SettledStepCaughtByTable", credit, at(dedup.Duplicate, dedup.LayerTable), true},
		{"SettledConflict", x, at(dedup.Conflict, dedup.LayerTable), true},
		{"WritesFirstClaim", x, at(dedup.First, ""), false},
		{"WritesRequestCaughtByTable", x, at(dedup.Duplicate, dedup.LayerTable), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := settledByClaims([]ledger.Command{tc.cmd}, tc.claims); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLayersMatchDedup: the consume-log's two layers carry the label
// values of the ledger's layers of the same names (classify converts).
func TestLayersMatchDedup(t *testing.T) {
	for d, l := range map[dedup.Layer]ledger.Layer{dedup.LayerCache: ledger.LayerRecentCache, dedup.LayerTable: ledger.LayerConsumeLog} {
		if ledger.Layer(d) != l {
			t.Errorf("dedup layer %q: got ledger layer %q, want %q", d, ledger.Layer(d), l)
		}
	}
}
