// Package loadgen drives transfers through running regions' HTTP APIs, as
// clients would: it opens accounts with an overdraft in every region, sends
// random same-region and cross-region transfers to random regions, and
// retries some of them with the same Idempotency-Key in another region.
// `paymesh load` runs it against the demo's regions or docker-compose.
package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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
	Seed        uint64
}

// Result counts what happened.
type Result struct {
	Sent, Completed, Accepted, Replayed, Retries int64
	Refused                                      map[string]int64 // by problem code
	Elapsed                                      time.Duration
}

// Run opens the accounts and sends the transfers. It returns an error when
// an account cannot be opened or a request fails for a reason other than a
// refusal (which is counted).
func Run(ctx context.Context, cfg Config, out io.Writer) (Result, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	var regions []string
	for r := range cfg.APIs {
		regions = append(regions, r)
	}
	if len(regions) == 0 || cfg.Accounts < 2 {
		return Result{}, errors.New("loadgen: need at least one region API and 2 accounts per region")
	}
	client := func(region string) *api.Client { return &api.Client{BaseURL: cfg.APIs[region], APIKey: cfg.APIKey} }
	accounts := map[string][]string{}
	for _, r := range regions {
		for range cfg.Accounts {
			res, err := client(r).CreateAccount(ctx, "EUR", r, -cfg.Overdraft)
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

	res := Result{Refused: map[string]int64{}}
	var mu sync.Mutex
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
				src, dst := regions[pick(len(regions))], regions[pick(len(regions))]
				from, to := accounts[src][pick(cfg.Accounts)], accounts[dst][pick(cfg.Accounts)]
				if from == to {
					continue
				}
				req := api.TransferRequest{From: from, To: to, Amount: int64(1 + pick(1000)), Currency: "EUR"}
				key := api.NewIdempotencyKey()
				tries := 1
				if coin(cfg.Retry) {
					tries = 2
				}
				for i := range tries {
					via := regions[pick(len(regions))]
					r, err := client(via).SendTransfer(ctx, req, key)
					var ae *api.Error
					switch {
					case errors.As(err, &ae):
						mu.Lock()
						res.Refused[string(ae.Problem.Code)]++
						mu.Unlock()
					case err != nil:
						select {
						case errs <- fmt.Errorf("POST /v1/transfers in %s: %w", via, err):
						default:
						}
						return
					case r.Replayed:
						replayed.Add(1)
					case r.Status == 201:
						completed.Add(1)
					default:
						accepted.Add(1)
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
loop:
	for i := range cfg.Transfers {
		select {
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
}
