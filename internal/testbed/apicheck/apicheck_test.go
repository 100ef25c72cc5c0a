package apicheck_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/paymesh/paymesh/internal/testbed/apicheck"
)

const (
	accountID  = "eu-0c9j1v4qkz8am"
	transferID = "eu-0c9j1v4qkz8an"
	transfer   = `{"id":"` + transferID + `","from":"eu-0c9j1v4qkz8ap","to":"us-0c9j1v4qkz8aq","amount":10,"currency":"EUR",` +
		`"status":"COMPLETED","version":3,"created_at":"2026-01-02T03:04:05Z","steps":[{"leg":"debit","account":"eu-0c9j1v4qkz8ap","amount":10}]}`
	account = `{"id":"` + accountID + `","currency":"EUR","balance":0,"held":0,"available":0,"floor":0,"closed":false,"frozen":false,"version":1,"created_at":"2026-01-02T03:04:05Z"}`
	problem = `{"type":"https://paymesh.dev/problems/not_found","title":"Not Found","status":404,"detail":"x","code":"not_found"}`
)

// TestCheck runs canned answers through the validator: the documented ones
// pass, and each kind of violation is refused with a message naming it.
func TestCheck(t *testing.T) {
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	problemCT := http.Header{"Content-Type": {"application/problem+json"}}
	cases := []struct {
		name, method, path string
		status             int
		header             http.Header
		body               string
		want               string // "" when valid, else part of the error
	}{
		{"OK", "GET", "/v1/transfers/" + transferID, 200, jsonCT, transfer, ""},
		{"OKAccount", "POST", "/v1/accounts", 201, http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/accounts/" + accountID}}, account, ""},
		{"OKProblem", "GET", "/v1/transfers/" + transferID, 404, problemCT, problem, ""},
		{"OKNoBody", "GET", "/healthz", 200, http.Header{}, "", ""},
		{"RenamedField", "GET", "/v1/transfers/" + transferID, 200, jsonCT, strings.Replace(transfer, `"id"`, `"transfer_id"`, 1), `property "id" is missing`},
		{"RenamedOptionalField", "GET", "/v1/transfers/" + transferID, 200, jsonCT, strings.Replace(transfer, `"steps"`, `"legs"`, 1), "legs"},
		{"WrongType", "GET", "/v1/accounts/" + accountID, 200, jsonCT, strings.Replace(account, `"balance":0`, `"balance":"0"`, 1), "balance"},
		{"OutOfEnum", "GET", "/v1/transfers/" + transferID, 200, jsonCT, strings.Replace(transfer, "COMPLETED", "DONE", 1), "DONE"},
		{"UnknownProblemCode", "GET", "/v1/transfers/" + transferID, 404, problemCT, strings.Replace(problem, `"code":"not_found"`, `"code":"gone"`, 1), "gone"},
		{"UndocumentedStatus", "GET", "/v1/accounts/" + accountID, 409, problemCT, problem, "status is not supported"},
		{"UndocumentedContentType", "GET", "/v1/accounts/" + accountID, 200, http.Header{"Content-Type": {"text/plain"}}, account, "text/plain"},
		{"ProblemAsJSON", "GET", "/v1/accounts/" + accountID, 404, jsonCT, problem, "application/json"},
		{"UndocumentedBody", "GET", "/healthz", 200, http.Header{"Content-Type": {"text/plain"}}, "ok", "declares none"},
		{"BadHeader", "POST", "/v1/transfers", 201, http.Header{"Content-Type": {"application/json"}, "Idempotent-Replayed": {"yes"}}, transfer, "Idempotent-Replayed"},
		{"NoOperation", "GET", "/v1/nothing", 200, jsonCT, "{}", "no operation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "http://127.0.0.1:1"+tc.path, nil)
			err := apicheck.Check(req, tc.status, tc.header, []byte(tc.body))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want no violation", err)
			case tc.want != "" && err == nil:
				t.Fatalf("got no violation, want one mentioning %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("got %v, want a violation mentioning %q", err, tc.want)
			}
		})
	}
}

// recorder is a testing.TB that keeps what Errorf reports.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// TestTransportFailsTheTest: a response that violates the document fails
// the test through Transport, and the caller still gets it whole; a valid
// one reports nothing.
func TestTransportFailsTheTest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Has("renamed") {
			_, _ = io.WriteString(w, strings.Replace(transfer, `"id"`, `"transfer_id"`, 1))
			return
		}
		_, _ = io.WriteString(w, transfer)
	}))
	defer srv.Close()
	rec := &recorder{TB: t}
	hc := &http.Client{Transport: apicheck.Transport(rec, nil)}
	for _, q := range []string{"", "?renamed"} {
		res, err := hc.Get(srv.URL + "/v1/transfers/" + transferID + q)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if !strings.Contains(string(b), `"amount":10`) {
			t.Errorf("GET%s: the caller got %q, want the whole body", q, b)
		}
	}
	if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "getTransfer (GET /v1/transfers/{id}) answered 200") ||
		!strings.Contains(rec.errors[0], `"id"`) {
		t.Fatalf("got reports %q, want one naming getTransfer, the status and the missing id", rec.errors)
	}
}
