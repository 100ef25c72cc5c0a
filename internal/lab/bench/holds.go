package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/paymesh/paymesh/services/api"
)

// HoldsRun is the holds scenario's result: plain transfers, holds, their
// captures and refunds of the captured transfers, each phase through the
// HTTP API of one region at the same concurrency, in the same run.
type HoldsRun struct {
	Concurrency int        `json:"concurrency"`
	Phases      []APIPhase `json:"phases"`
	Verified    bool       `json:"verified"`
	// VerifyReport says what failed when Verified is false.
	VerifyReport string `json:"verify_report,omitempty"`
}

// APIPhase is one kind of request of the holds scenario.
type APIPhase struct {
	Name     string        `json:"name"`
	Requests int           `json:"requests"`
	Answered int64         `json:"answered"` // with the phase's success status
	Other    map[int]int64 `json:"other,omitempty"`
	Seconds  float64       `json:"seconds"`
	Rate     float64       `json:"rate"`
	P50Ms    float64       `json:"p50_ms"`
	P99Ms    float64       `json:"p99_ms"`
}

func (h HoldsRun) line() string {
	var parts []string
	for _, p := range h.Phases {
		parts = append(parts, fmt.Sprintf("%s %.0f/s (p99 %.1f ms)", p.Name, p.Rate, p.P99Ms))
	}
	return fmt.Sprintf("%-13s %s at %d in flight  %s", Holds, strings.Join(parts, ", "), h.Concurrency, invariants(h.Verified, h.VerifyReport))
}

// apiReq is one request of a phase: where it goes, its body, and the
// status that answers it successfully.
type apiReq struct {
	path string
	body []byte
	want int
	// id asks for the ID the answer names (its body is decoded; otherwise
	// discarded unread, as a client that needs nothing of it would).
	id bool
}

// holds runs one region (as the api scenario does) and sends, at the first
// APIConcurrency, APITransfers/4 each of: plain transfers; holds; captures
// of those holds (half of them in part); refunds of half of each captured
// amount by its payee. Every phase waits for the one before, so that each
// rate is its own.
func (e *env) holds(ctx context.Context) (HoldsRun, error) {
	concurrency := 64
	if len(e.cfg.APIConcurrency) > 0 {
		concurrency = e.cfg.APIConcurrency[0]
	}
	res := HoldsRun{Concurrency: concurrency}
	c, region, accounts, stop, err := e.apiRegion(ctx, "holds_")
	if err != nil {
		return res, err
	}
	defer stop()
	store := region.Ledger.Store
	n := max(e.cfg.APITransfers/4, 1)
	bodies := e.apiRequests(accounts, 2*n)
	phase := func(name string, reqs []apiReq) ([]string, error) {
		e.checkpoint(ctx)
		p, ids, err := e.drivePhase(ctx, name, region.APIURL, reqs, concurrency)
		res.Phases = append(res.Phases, p)
		return ids, err
	}
	var plain, holds []apiReq
	for i := range n {
		plain = append(plain, apiReq{path: "/v1/transfers", body: bodies[i], want: http.StatusCreated})
		var t api.TransferRequest
		_ = json.Unmarshal(bodies[n+i], &t)
		t.Hold = true
		b, _ := json.Marshal(t)
		holds = append(holds, apiReq{path: "/v1/transfers", body: b, want: http.StatusCreated, id: true})
	}
	if _, err := phase("transfer", plain); err != nil {
		return res, err
	}
	held, err := phase("hold", holds)
	if err != nil {
		return res, err
	}
	var captures, refunds []apiReq
	for i, id := range held {
		if id == "" { // not held: counted in the phase's other answers
			continue
		}
		var t api.TransferRequest
		_ = json.Unmarshal(holds[i].body, &t)
		amount := t.Amount
		if i%2 == 1 {
			amount = max(t.Amount/2, 1)
		}
		b, _ := json.Marshal(api.ActionRequest{Amount: amount})
		captures = append(captures, apiReq{path: "/v1/transfers/" + id + "/capture", body: b, want: http.StatusOK})
		r, _ := json.Marshal(api.ActionRequest{Amount: max(amount/2, 1)})
		refunds = append(refunds, apiReq{path: "/v1/transfers/" + id + "/refunds", body: r, want: http.StatusCreated})
	}
	if _, err := phase("capture", captures); err != nil {
		return res, err
	}
	if _, err := phase("refund", refunds); err != nil {
		return res, err
	}
	rep, err := quietReport(ctx, c)
	if err != nil {
		return res, err
	}
	var completed, captured, refunded int64
	if err := store.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE type = 'transfer' AND status = 'COMPLETED' AND expires_at IS NULL),
			count(*) FILTER (WHERE expires_at IS NOT NULL AND status = 'COMPLETED'),
			count(*) FILTER (WHERE type = 'refund' AND status = 'COMPLETED')
			FROM transfers WHERE client_id = $1`, Client).Scan(&completed, &captured, &refunded); err != nil {
		return res, err
	}
	res.Verified = rep.OK()
	for _, p := range res.Phases {
		res.Verified = res.Verified && len(p.Other) == 0 && p.Answered == int64(p.Requests)
	}
	res.Verified = res.Verified && completed == int64(n) && captured == int64(len(captures)) && refunded == int64(len(refunds)) &&
		len(captures) == n
	if !res.Verified {
		res.VerifyReport = fmt.Sprintf("%d transfers, %d captured holds and %d refunds completed for %d of each; phases %+v\n%s",
			completed, captured, refunded, n, res.Phases, rep)
	}
	return res, nil
}

// drivePhase sends a phase's requests (drive) and returns its figures and
// the IDs its answers named.
func (e *env) drivePhase(ctx context.Context, name, base string, reqs []apiReq, concurrency int) (APIPhase, []string, error) {
	load, ids, err := e.drive(ctx, Holds+" "+name, base, reqs, concurrency)
	p := APIPhase{Name: name, Requests: len(reqs), Answered: load.completed, Other: load.other, Seconds: load.seconds}
	if p.Seconds > 0 {
		p.Rate = float64(p.Answered) / p.Seconds
	}
	p.P50Ms, p.P99Ms = ms(percentile(load.lat, 0.5)), ms(percentile(load.lat, 0.99))
	return p, ids, err
}

// postFor sends one request of a phase and returns its status and the ID
// its answer names.
func postFor(ctx context.Context, hc *http.Client, base, key string, r apiReq) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.path, bytes.NewReader(r.body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if !r.id {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, "", nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var t api.TransferBody
	_ = json.Unmarshal(b, &t)
	return resp.StatusCode, t.ID, nil
}
