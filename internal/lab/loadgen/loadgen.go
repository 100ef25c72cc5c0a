// Package loadgen drives transfers through running regions' HTTP APIs, as
// clients would: it opens accounts with an overdraft in every region, sends
// same-region and cross-region transfers (a set share of them cross-region)
// to random regions, and retries some of them with the same
// Idempotency-Key in another region. `paymesh-lab load` runs it against the
// demo's regions, docker-compose or the process simulation (paymesh-lab sim),
// which reads the history of acknowledged transfers it can write.
package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/paymesh/paymesh/services/api"
)

// Config sets the load.
type Config struct {
	// APIs maps region names to API base URLs.
	APIs        map[string]string
	APIKey      string
	Accounts    int     // per region
	Overdraft   int64   // each account's overdraft (minor units); the client must be allowed it
	Transfers   int     // to send
	Concurrency int     // requests in flight
	Retry       float64 // share of transfers sent again with the same key in another region
	// Cross is the share of transfers whose two accounts live in different
	// regions (0..1).
	Cross float64
	// Attempts bounds the tries of each request on network errors, 409,
	// 429 and 5xx (default 20, about 50 s: long enough to ride out a
	// restarting region).
	Attempts uint
	// History, if set, gets one JSON line (a HistoryEntry) per
	// acknowledged transfer request (201 or 202), retries included.
	History io.Writer
	// Client is the API key's client id, written to the history.
	Client string
	// Duration, if set, stops sending new transfers after this long, even
	// if fewer than Transfers were sent.
	Duration time.Duration
	Seed     uint64
}

// HistoryEntry is one acknowledged transfer request.
type HistoryEntry struct {
	Key        string `json:"key"`
	Client     string `json:"client,omitempty"`
	Region     string `json:"region"` // the region whose API was asked
	Status     int    `json:"status"` // 201 or 202
	TransferID string `json:"transfer_id"`
	From       string `json:"from"`
	To         string `json:"to"`
	Replayed   bool   `json:"replayed,omitempty"`
	// Sent and Answered are when the request was first sent and when its
	// answer came (Unix milliseconds); Tries how many times it was sent
	// (the client retries network errors, 429 and 5xx with the same key).
	Sent     int64 `json:"sent,omitempty"`
	Answered int64 `json:"answered,omitempty"`
	Tries    int   `json:"tries,omitempty"`
}

// ReadHistory decodes the JSON lines a run wrote to Config.History. It
// returns an error naming the line that does not decode.
func ReadHistory(r io.Reader) ([]HistoryEntry, error) {
	var out []HistoryEntry
	dec := json.NewDecoder(r)
	for line := 1; ; line++ {
		var e HistoryEntry
		err := dec.Decode(&e)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("loadgen: history entry %d: %w", line, err)
		}
		out = append(out, e)
	}
}

// Result counts what happened.
type Result struct {
	Sent, Completed, Accepted, Replayed, Retries int64
	Refused                                      map[string]int64 // by problem code
	// Failed counts requests that got no answer within Config.Attempts,
	// by the region asked; FirstFailure is the first such error.
	Failed       map[string]int64
	FirstFailure string
	Elapsed      time.Duration
}

// openAccount opens an account in region, again while the API refuses the
// connection (a fault the run schedules may have stopped it: the request
// never reached it, so a retry opens no second account), for at most a
// minute. It uses no Idempotency-Key: under one, opening an account also
// needs the key's home region, which the run's faults may have stopped.
func openAccount(ctx context.Context, c *api.Client, region string, floor int64) (api.Response, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := c.CreateAccount(ctx, api.AccountRequest{Currency: "EUR", Region: region, Floor: floor}, "")
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return api.Response{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Run opens the accounts and sends the transfers. It returns an error when
// an account cannot be opened or a request fails for a reason other than a
// refusal (which is counted).
func Run(ctx context.Context, cfg Config, out io.Writer) (Result, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.Attempts == 0 {
		cfg.Attempts = 20
	}
	if cfg.Cross < 0 || cfg.Cross > 1 || cfg.Retry < 0 || cfg.Retry > 1 {
		return Result{}, fmt.Errorf("loadgen: cross share %v and retry share %v must be between 0 and 1", cfg.Cross, cfg.Retry)
	}
	var regions []string
	for r := range cfg.APIs {
		regions = append(regions, r)
	}
	sort.Strings(regions) // the seed picks the same regions every run
	if len(regions) == 0 || cfg.Accounts < 2 {
		return Result{}, errors.New("loadgen: need at least one region API and 2 accounts per region")
	}
	if cfg.Cross > 0 && len(regions) < 2 {
		return Result{}, errors.New("loadgen: cross-region transfers need at least two region APIs")
	}
	client := func(region string) *api.Client {
		return &api.Client{BaseURL: cfg.APIs[region], APIKey: cfg.APIKey, Attempts: cfg.Attempts}
	}
	accounts := map[string][]string{}
	for _, r := range regions {
		for range cfg.Accounts {
			res, err := openAccount(ctx, client(r), r, -cfg.Overdraft)
			if err != nil {
				return Result{}, fmt.Errorf("open an account in %s: %w", r, err)
			}
			var a api.AccountBody
			if err := json.Unmarshal(res.Body, &a); err != nil {
				return Result{}, err
			}
			accounts[r] = append(accounts[r], a.ID)
		}
	}
	fmt.Fprintf(out, "opened %d accounts in each of %d regions; sending %d transfers\n", cfg.Accounts, len(regions), cfg.Transfers)

	res := Result{Refused: map[string]int64{}, Failed: map[string]int64{}}
	var mu sync.Mutex // guards res's maps, FirstFailure and the history
	record := func(e HistoryEntry) error {
		if cfg.History == nil {
			return nil
		}
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		_, err = cfg.History.Write(append(b, '\n'))
		return err
	}
	var sent, completed, accepted, replayed, retries atomic.Int64
	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	var rngMu sync.Mutex
	pick := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }
	coin := func(p float64) bool { rngMu.Lock(); defer rngMu.Unlock(); return rng.Float64() < p }

	start := time.Now()
	jobs := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() {
			for range jobs {
				src, dst := regions[pick(len(regions))], ""
				if coin(cfg.Cross) {
					for dst = src; dst == src; {
						dst = regions[pick(len(regions))]
					}
				} else {
					dst = src
				}
				from, to := accounts[src][pick(cfg.Accounts)], accounts[dst][pick(cfg.Accounts)]
				for to == from {
					to = accounts[dst][pick(cfg.Accounts)]
				}
				req := api.TransferRequest{From: from, To: to, Amount: int64(1 + pick(1000)), Currency: "EUR"}
				key := api.NewIdempotencyKey()
				tries := 1
				if coin(cfg.Retry) {
					tries = 2
				}
				for i := range tries {
					via := regions[pick(len(regions))]
					asked := time.Now()
					r, err := client(via).SendTransfer(ctx, req, key)
					var ae *api.Error
					switch {
					case errors.As(err, &ae):
						mu.Lock()
						res.Refused[string(ae.Problem.Code)]++
						mu.Unlock()
					case err != nil && ctx.Err() != nil:
						return
					case err != nil:
						mu.Lock()
						res.Failed[via]++
						if res.FirstFailure == "" {
							res.FirstFailure = fmt.Sprintf("POST /v1/transfers in %s: %v", via, err)
						}
						mu.Unlock()
					default:
						switch {
						case r.Replayed:
							replayed.Add(1)
						case r.Status == 201:
							completed.Add(1)
						default:
							accepted.Add(1)
						}
						var body api.TransferBody
						if err := json.Unmarshal(r.Body, &body); err != nil {
							err = fmt.Errorf("POST /v1/transfers in %s: answer %d: %w", via, r.Status, err)
							select {
							case errs <- err:
							default:
							}
							return
						}
						if err := record(HistoryEntry{Key: key, Client: cfg.Client, Region: via, Status: r.Status, TransferID: body.ID,
							From: from, To: to, Replayed: r.Replayed, Sent: asked.UnixMilli(), Answered: time.Now().UnixMilli(), Tries: r.Tries}); err != nil {
							select {
							case errs <- fmt.Errorf("loadgen: write the history: %w", err):
							default:
							}
							return
						}
					}
					if i == 0 {
						sent.Add(1)
					} else {
						retries.Add(1)
					}
				}
			}
		})
	}
	var stop <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		stop = t.C
	}
loop:
	for i := range cfg.Transfers {
		select {
		case <-stop:
			break loop
		case jobs <- i:
		case err := <-errs:
			close(jobs)
			wg.Wait()
			return res, err
		case <-ctx.Done():
			break loop
		}
	}
	close(jobs)
	wg.Wait()
	res.Sent, res.Completed, res.Accepted, res.Replayed, res.Retries = sent.Load(), completed.Load(), accepted.Load(), replayed.Load(), retries.Load()
	res.Elapsed = time.Since(start)
	select {
	case err := <-errs:
		return res, err
	default:
	}
	return res, ctx.Err()
}

// Print writes a summary.
func (r Result) Print(w io.Writer) {
	fmt.Fprintf(w, "sent %d transfers in %s (%.0f/s): %d completed within the wait, %d accepted (202); %d retries with the same key, %d answered as replays\n",
		r.Sent, r.Elapsed.Round(time.Millisecond), float64(r.Sent)/r.Elapsed.Seconds(), r.Completed, r.Accepted, r.Retries, r.Replayed)
	for code, n := range r.Refused {
		fmt.Fprintf(w, "refused %s: %d\n", code, n)
	}
	for region, n := range r.Failed {
		fmt.Fprintf(w, "no answer from %s after every retry: %d\n", region, n)
	}
	if r.FirstFailure != "" {
		fmt.Fprintf(w, "first of them: %s\n", r.FirstFailure)
	}
}
