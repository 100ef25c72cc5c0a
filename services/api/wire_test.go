package api

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/services/ledger"
)

// seeds are the nasty request bodies kept in testdata/requests: each line
// is one body.
func seeds(tb testing.TB) []string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "requests.txt"))
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// FuzzDecodeTransferRequest: the decoder never panics, and whatever it
// accepts has a positive int64 amount, a real currency and two accounts,
// and round-trips through JSON unchanged.
func FuzzDecodeTransferRequest(f *testing.F) {
	for _, s := range seeds(f) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeTransferRequest(body)
		if err != nil {
			if ledger.ErrorCode(err) == "" {
				t.Fatalf("error without a code: %v", err)
			}
			return
		}
		if r.Amount <= 0 || !ledger.ValidCurrency(r.Currency) || r.From == "" || r.To == "" || r.From == r.To {
			t.Fatalf("accepted an invalid request %+v from %q", r, body)
		}
		b, _ := json.Marshal(r)
		again, err := DecodeTransferRequest(b)
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip of %+v: %+v %v", r, again, err)
		}
	})
}

// FuzzDecodeTransferFastAgrees: the one-pass decoder accepts only what the
// strict one accepts, decoded the same: whatever it refuses goes to the
// strict one, so it may refuse more, never less.
func FuzzDecodeTransferFastAgrees(f *testing.F) {
	for _, s := range append(seeds(f), fastCases...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkFastAgrees(t, body) })
}

// fastCases are bodies where the two decoders could part: spellings the
// strict one refuses and the JSON v2 decoder has its own rules for.
var fastCases = []string{
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR"}`,
	` {"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR"} `,
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR"}{}`,
	`{"From":"eu-1","to":"eu-2","amount":5,"currency":"EUR"}`,
	`{"from":"eu-1","from":"eu-3","to":"eu-2","amount":5,"currency":"EUR"}`,
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR","x":1}`,
	`{"from":"eu-1","to":"eu-2","amount":5.0,"currency":"EUR"}`,
	`{"from":"eu-1","to":"eu-2","amount":"5","currency":"EUR"}`,
	`{"from":"eu-1","to":"eu-2","amount":null,"currency":"EUR"}`,
	`{"from":"eu-1","to":"eu-2","amount":-0,"currency":"EUR"}`,
	`{"from":"eu-1","to":"eu-2","amount":05,"currency":"EUR"}`,
	`{"from":null,"to":"eu-2","amount":5,"currency":"EUR"}`,
	`{"from":"eu-\u0031","to":"eu-2","amount":5,"currency":"EUR"}`,
	"{\"from\":\"eu-\xff\",\"to\":\"eu-2\",\"amount\":5,\"currency\":\"EUR\"}",
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR","reference":"o-1","metadata":{"a":"1"}}`,
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR","metadata":{"a":"1","a":"2"}}`,
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR","metadata":{"a":1}}`,
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR","metadata":null}`,
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR","metadata":{}}`,
	`{"from":"eu-1","to":"eu-2","amount":5,"currency":"EUR","Metadata":{"a":"1"}}`,
	`null`, `[]`, `"x"`, ``, `{}`,
}

func checkFastAgrees(t *testing.T, body []byte) {
	t.Helper()
	fast, ok := decodeTransferFast(body)
	if !ok {
		return
	}
	var strict TransferRequest
	if err := decodeStrict(body, &strict, "from", "to", "amount", "currency", "hold", "expires_at", "reference", "metadata"); err != nil {
		t.Fatalf("the fast decoder accepted %q, which the strict one refuses: %v", body, err)
	}
	if !reflect.DeepEqual(fast, strict) {
		t.Fatalf("%q: fast %+v, strict %+v", body, fast, strict)
	}
}

// TestDecodeTransferFastAgrees runs the fuzz target's check on its seeds,
// and shows the fast decoder takes a plain request.
func TestDecodeTransferFastAgrees(t *testing.T) {
	for _, s := range append(seeds(t), fastCases...) {
		checkFastAgrees(t, []byte(s))
	}
	if _, ok := decodeTransferFast([]byte(fastCases[0])); !ok {
		t.Fatalf("the fast decoder refused a plain request %s", fastCases[0])
	}
}

// FuzzParseAmount: no panic, and an accepted amount is exactly the decimal
// integer it was written as.
func FuzzParseAmount(f *testing.F) {
	for _, s := range []string{"1", "0", "-1", "1.0", "1e3", "+5", "9223372036854775807", "9223372036854775808", "", " 1", "0x10", "١"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ledger.ParseAmount(s)
		if err != nil {
			if ledger.ErrorCode(err) != ledger.CodeInvalidAmount {
				t.Fatalf("%q: error %v without invalid_amount", s, err)
			}
			return
		}
		if b, _ := json.Marshal(n); string(b) != strings.TrimPrefix(s, "+") && !(s == "-0" && n == 0) {
			t.Fatalf("%q parsed as %d", s, n)
		}
	})
}

func TestSeedsAreRefused(t *testing.T) {
	for _, s := range seeds(t) {
		if strings.Contains(s, `"valid"`) {
			continue
		}
		if _, err := DecodeTransferRequest([]byte(s)); err == nil {
			t.Errorf("accepted %s", s)
		}
	}
}

// TestBodyID: the transfer ID of a stored body, for its Location header,
// read from the front of the bodies paymesh stores and decoded from any
// other; none from a body that names no transfer.
func TestBodyID(t *testing.T) {
	own, _ := json.Marshal(TransferBody{ID: "eu-123", From: "eu-1", To: "eu-2", Amount: 5, Currency: "EUR", Status: "COMPLETED"})
	for _, tc := range []struct{ body, want string }{
		{string(own), "eu-123"},
		{`{"status":"COMPLETED","id":"eu-9"}`, "eu-9"},
		{`{"id":"eu-\u0031x"}`, "eu-1x"},
		{`{"id":""}`, ""},
		{`{"type":"about:blank"}`, ""},
		{`not json`, ""},
		{``, ""},
	} {
		if got := bodyID([]byte(tc.body)); got != tc.want {
			t.Errorf("bodyID(%s) = %q, want %q", tc.body, got, tc.want)
		}
	}
}
