package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
)

// Purposes of scenario 17's ops.
const (
	// PurposeOldKey marks a transfer sent with the rotated client's old
	// API key. One sent after its region's revocation bound must be
	// refused, so it is recorded as failed whatever the answer: I3 then
	// requires that it has no effect.
	PurposeOldKey = "old-key"
	// PurposeNewKey marks a transfer sent with the rotated client's new
	// key: it must be answered 2xx from the rotation on.
	PurposeNewKey = "new-key"
)

// rotatingClientID is scenario 17's API client, whose key is rotated.
const rotatingClientID = "chaos-rotating"

// revocationBound is how long after a revocation commits an API process
// may still take the revoked key: its client cache's TTL (api.Config's
// ClientCacheTTL, --client-cache-ttl), set to its documented default on
// every region's API in scenario 17, so that the bound checked is the one
// configured.
const revocationBound = 2 * time.Second

// minAfterBound is how many requests with the old key each region must
// answer, sent after its revocation bound, before scenario 17 ends.
const minAfterBound = 3

// keyUse counts one region's requests with one of the rotated client's
// keys.
type keyUse struct {
	sent, ok, unauthorized int
	// overlap counts the 2xx answers that came before the revocation
	// began (of the new key: the overlap of the two keys).
	overlap int
}

// rotation is scenario 17's state: the rotated client's keys and
// accounts, when each region's revocation began and committed, and what
// the requests with each key got back.
type rotation struct {
	oldKey, newKey string
	accts          map[string][]string // region -> the client's two accounts (floor -funding)

	mu sync.Mutex
	// revoking is when the first revocation began: an old-key request
	// answered before it must have worked.
	revoking time.Time
	// began and revoked are when each region's revocation began and
	// committed (RevokeKey returned); bound is revoked + revocationBound.
	began, revoked, bound map[string]time.Time
	// firstRefused is when each region first refused the old key with a
	// 401.
	firstRefused map[string]time.Time
	// Per region: the old key's requests answered before the revocation
	// began, the rest of those sent before the bound, and those sent after
	// it; the new key's from the rotation on.
	oldBefore, oldDuring, oldAfter, withNew map[string]*keyUse
	wrong                                   []string    // old-key requests sent after the bound that were not refused 401
	gaps                                    []string    // new-key requests, and old-key ones answered before the revocation, not answered 2xx
	afterKeys                               []clientKey // of the old-key requests sent after the bound
}

// setup registers the rotated client with its old key in every region
// and opens two accounts for it there, which may go a funding into
// overdraft (so that no request of the scenario fails for want of money).
func (r *rotation) setup(ctx context.Context, e *env) error {
	r.oldKey, r.newKey = newAPIKey("pm_chaos_old_"), newAPIKey("pm_chaos_new_")
	r.mu.Lock()
	r.accts, r.began, r.revoked, r.bound, r.firstRefused = map[string][]string{}, map[string]time.Time{}, map[string]time.Time{},
		map[string]time.Time{}, map[string]time.Time{}
	r.oldBefore, r.oldDuring, r.oldAfter, r.withNew = map[string]*keyUse{}, map[string]*keyUse{}, map[string]*keyUse{}, map[string]*keyUse{}
	for _, n := range e.names {
		for _, m := range []map[string]*keyUse{r.oldBefore, r.oldDuring, r.oldAfter, r.withNew} {
			m[n] = &keyUse{}
		}
	}
	r.mu.Unlock()
	for _, n := range e.names {
		reg := e.c.Region(n)
		if err := reg.APIStore.PutClient(ctx, api.RegisteredClient{ID: rotatingClientID, Name: "chaos rotating", RatePerSec: 1_000_000}, r.oldKey); err != nil {
			return err
		}
		for range 2 {
			a, _, err := reg.Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: rotatingClientID, Currency: "EUR", Floor: -funding})
			if err != nil {
				return fmt.Errorf("an account of %s in %s: %w", rotatingClientID, n, err)
			}
			r.accts[n] = append(r.accts[n], a.ID)
		}
	}
	return nil
}

// keyRequest is one transfer sent with one of the rotated client's keys.
type keyRequest struct {
	via, key string
	i        int       // its op in the history
	sent     time.Time // just before it was sent
	done     time.Time // when its answer came
	status   int
	body     []byte
	err      error
}

// detail is the request's answer, for a failure.
func (k keyRequest) detail() string {
	if k.err != nil {
		return "no answer: " + k.err.Error()
	}
	return fmt.Sprintf("%d %.200s", k.status, k.body)
}

// send sends the n-th transfer of the rotated client with apiKey, through
// a region's API in turn, between its accounts in that region or, every
// other round, in the next region (a call the API forwards there), and
// records it in the history with purpose.
func (r *rotation) send(ctx context.Context, e *env, n int, apiKey, purpose string) keyRequest {
	via := e.names[n%len(e.names)]
	home := via
	if n/len(e.names)%2 == 1 {
		home = e.names[(n+1)%len(e.names)]
	}
	b := Body{Type: ledger.TypeTransfer, From: r.accts[home][n%2], To: r.accts[home][(n+1)%2], Amount: 1 + int64(n%50), Currency: "EUR"}
	k := keyRequest{via: via, key: fmt.Sprintf("s%d-rotation-%s-%d", e.seed, purpose, n)}
	k.i = e.hist.Invoke(Op{Client: rotatingClientID, Key: k.key, Body: b, Path: "api", Via: via, Purpose: purpose})
	payload, _ := json.Marshal(api.TransferRequest{From: b.From, To: b.To, Amount: b.Amount, Currency: b.Currency})
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+apiKey)
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Idempotency-Key", k.key)
	k.sent = time.Now()
	k.status, k.body, k.err = e.do(ctx, via, http.MethodPost, "/v1/transfers", hdr, payload)
	k.done = time.Now()
	return k
}

// useOld sends the n-th transfer with the old key and sorts its answer:
// sent after its region's bound it must be refused 401 (and is recorded
// as failed whatever it got); answered before the revocation began it
// must be 2xx; between the two either.
func (r *rotation) useOld(ctx context.Context, e *env, n int) {
	k := r.send(ctx, e, n, r.oldKey, PurposeOldKey)
	r.mu.Lock()
	defer r.mu.Unlock()
	refused := k.err == nil && k.status == http.StatusUnauthorized
	if refused && r.firstRefused[k.via].IsZero() {
		r.firstRefused[k.via] = k.done
	}
	bound := r.bound[k.via]
	switch {
	case !bound.IsZero() && !k.sent.Before(bound):
		e.hist.Complete(k.i, Fail, "sent after the revocation bound: must be refused: "+k.detail(), "")
		u := r.oldAfter[k.via]
		u.sent++
		r.afterKeys = append(r.afterKeys, clientKey{rotatingClientID, k.key})
		if refused {
			u.unauthorized++
			return
		}
		r.wrong = append(r.wrong, fmt.Sprintf("key %s/%s via %s, sent %v after the revocation committed there, not refused 401: %s",
			rotatingClientID, k.key, k.via, k.sent.Sub(r.revoked[k.via]).Round(time.Millisecond), k.detail()))
	case r.revoking.IsZero() || k.done.Before(r.revoking):
		u := r.oldBefore[k.via]
		u.sent++
		if o, _ := e.completeAnswer(k.i, k.status, k.body, k.err); o == OK {
			u.ok++
			return
		}
		r.gaps = append(r.gaps, fmt.Sprintf("the old key before its revocation, key %s via %s: %s", k.key, k.via, k.detail()))
	default:
		u := r.oldDuring[k.via]
		u.sent++
		if o, _ := e.completeAnswer(k.i, k.status, k.body, k.err); o == OK {
			u.ok++
		} else if refused {
			u.unauthorized++
		}
	}
}

// useNew sends the n-th transfer with the new key: it must be answered
// 2xx.
func (r *rotation) useNew(ctx context.Context, e *env, n int) {
	k := r.send(ctx, e, n, r.newKey, PurposeNewKey)
	o, _ := e.completeAnswer(k.i, k.status, k.body, k.err)
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.withNew[k.via]
	u.sent++
	if o != OK {
		r.gaps = append(r.gaps, fmt.Sprintf("the new key, key %s via %s: %s", k.key, k.via, k.detail()))
		return
	}
	u.ok++
	if r.revoking.IsZero() || k.done.Before(r.revoking) {
		u.overlap++
	}
}

// keep calls use with 0, 1, ... every 5 ms until stop ends; each request
// runs on ctx, to its end.
func (r *rotation) keep(stop, ctx context.Context, e *env, use func(context.Context, *env, int)) {
	for n := 0; stop.Err() == nil; n++ {
		use(ctx, e, n)
		select {
		case <-stop.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// each reports whether ok holds for every region's count in m (false
// before the setup made them).
func (r *rotation) each(m func(*rotation) map[string]*keyUse, ok func(*keyUse) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(m(r)) == 0 {
		return false
	}
	for _, u := range m(r) {
		if !ok(u) {
			return false
		}
	}
	return true
}

// until waits for cond, polled every 10 ms; false if ctx ended first.
func until(ctx context.Context, cond func() bool) bool {
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
}

// The counts each and sum read.
func oldBefore(r *rotation) map[string]*keyUse { return r.oldBefore }
func oldAfter(r *rotation) map[string]*keyUse  { return r.oldAfter }
func withNew(r *rotation) map[string]*keyUse   { return r.withNew }

// rotate runs the rotation as an operator would (paymesh client rotate,
// then revoke), each step on its event: once a fifth of the run d from
// start has passed and the old key has worked in every region, a new key
// is added in every region and its sender started; once two fifths have
// passed and the new key has worked in every region, the old key is
// revoked in each, and each region's bound taken from its revocation's
// commit. It returns when stop ends before a step, or when an operator's
// step fails, with its error.
func (r *rotation) rotate(stop, ctx context.Context, e *env, start time.Time, d time.Duration, senders *sync.WaitGroup) error {
	if !at(stop, start, d, 0.2) || !until(stop, func() bool { return r.each(oldBefore, func(u *keyUse) bool { return u.ok > 0 }) }) {
		return nil
	}
	var added api.KeyInfo
	for _, n := range e.names {
		k, err := e.c.Region(n).APIStore.AddKey(ctx, rotatingClientID, r.newKey, time.Time{})
		if err != nil {
			return fmt.Errorf("rotate the key of %s in %s: %w", rotatingClientID, n, err)
		}
		added = k
	}
	senders.Go(func() { r.keep(stop, ctx, e, r.useNew) })
	if !at(stop, start, d, 0.4) || !until(stop, func() bool { return r.each(withNew, func(u *keyUse) bool { return u.ok > 0 }) }) {
		return nil
	}
	keys, err := e.c.Region(e.names[0]).APIStore.Keys(ctx, rotatingClientID)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(keys, func(k api.KeyInfo) bool { return k.ID != added.ID })
	if i < 0 {
		return fmt.Errorf("%s has no key but the new one (%+v)", rotatingClientID, keys)
	}
	r.mu.Lock()
	r.revoking = time.Now()
	r.mu.Unlock()
	for _, n := range e.names {
		began := time.Now()
		if err := e.c.Region(n).APIStore.RevokeKey(ctx, rotatingClientID, keys[i].ID); err != nil {
			return fmt.Errorf("revoke the old key of %s in %s: %w", rotatingClientID, n, err)
		}
		committed := time.Now()
		r.mu.Lock()
		r.began[n], r.revoked[n], r.bound[n] = began, committed, committed.Add(revocationBound)
		r.mu.Unlock()
	}
	return nil
}

// sum adds up the regions' counts of m.
func sum(m map[string]*keyUse) keyUse {
	var t keyUse
	for _, u := range m {
		t.sent, t.ok, t.unauthorized, t.overlap = t.sent+u.sent, t.ok+u.ok, t.unauthorized+u.unauthorized, t.overlap+u.overlap
	}
	return t
}

// checks are scenario 17's own: revoked, new key and applied.
func (r *rotation) checks(ctx context.Context, e *env) ([]Check, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	before, during, after, fresh := sum(r.oldBefore), sum(r.oldDuring), sum(r.oldAfter), sum(r.withNew)
	var first []string
	for _, n := range e.names {
		if t := r.firstRefused[n]; !t.IsZero() && !r.began[n].IsZero() {
			first = append(first, fmt.Sprintf("%s %v", n, t.Sub(r.began[n]).Round(time.Millisecond)))
		} else {
			first = append(first, n+" never")
		}
	}
	revoked := Check{Name: "revoked", OK: true, Checked: int64(after.sent),
		What: fmt.Sprintf("every request with the revoked key sent after its region's bound (the revocation's commit + %v) was refused 401: "+
			"the old key was answered 2xx %d times of %d before the revocation; %d sent between it and the bound (%d refused 401, %d 2xx); "+
			"%d sent after the bound, %d refused 401; first refusals after each region's revocation began: %s",
			revocationBound, before.ok, before.sent, during.sent, during.unauthorized, during.ok, after.sent, after.unauthorized,
			strings.Join(first, ", "))}
	if r.revoking.IsZero() {
		revoked.fail("the old key was never revoked")
	}
	for _, n := range e.names {
		if r.oldAfter[n].sent == 0 {
			revoked.fail("%s: no request with the revoked key was sent after its bound", n)
		}
	}
	for _, w := range r.wrong {
		revoked.fail("%s", w)
	}
	newKey := Check{Name: "new key", OK: true, Checked: int64(fresh.sent + before.sent),
		What: fmt.Sprintf("every request with the new key was answered 2xx from the rotation on, and every one with the old key answered "+
			"before its revocation began: the new key %d sent, %d 2xx (%d before the revocation: the overlap)", fresh.sent, fresh.ok, fresh.overlap)}
	for _, n := range e.names {
		if r.withNew[n].overlap == 0 {
			newKey.fail("%s: the new key never worked before the old one was revoked", n)
		}
	}
	for _, g := range r.gaps {
		newKey.fail("%s", g)
	}
	applied, err := checkUnapplied(ctx, e.c, "no request with the revoked key sent after the bound made a transfer or an entry", r.afterKeys)
	return []Check{revoked, newKey, applied}, err
}

// rotationScenario is issue 25's key rotation under load: while the
// workload runs, a second client sends transfers with its key through
// every region's API; its key is rotated (a new key added in every
// region, a sender started on it) and, once the new key has worked in
// every region, the old one is revoked in each while its sender goes on.
// Every request with the old key sent after its region's bound (the
// revocation's commit + the API's client cache TTL) must be refused 401
// and have no effect; every request with the new key must be answered 2xx
// throughout. The run goes on until each region has answered
// minAfterBound old-key requests sent after its bound: no fixed sleep.
func rotationScenario() *scenario {
	r := &rotation{}
	return &scenario{
		name: "17-key-rotation",
		what: fmt.Sprintf("a second API client sends transfers every 5 ms through each region's API in turn with its key; at 20 %% of the "+
			"run the key is rotated (a new key in every region, then a sender on it, as paymesh client rotate) and at 40 %%, once the new "+
			"key worked in every region, the old one revoked in each (as paymesh client revoke) while its sender goes on: every old-key "+
			"request sent after the region's bound (the revocation's commit + the API's client cache TTL, %v) must be refused 401 and "+
			"have no effect, every new-key request must be answered 2xx; the run goes on until every region answered %d old-key "+
			"requests sent after its bound",
			revocationBound, minAfterBound),
		counts: "requests with the revoked key sent after the bound and refused 401",
		configure: func(_ *env, c *cluster.Config) {
			onAPI(c, func(ac *apid.Config) { ac.ClientCacheTTL = revocationBound })
		},
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			rctx := context.WithoutCancel(ctx)
			if err := r.setup(rctx, e); err != nil {
				return err
			}
			start := time.Now() // the rotation's steps fall at fractions of the senders' run
			stop, cancel := context.WithCancel(ctx)
			var senders sync.WaitGroup
			defer senders.Wait()
			defer cancel() // before the wait: the senders stop on an error too
			senders.Go(func() { r.keep(stop, rctx, e, r.useOld) })
			if err := r.rotate(stop, rctx, e, start, d, &senders); err != nil {
				return err
			}
			<-stop.Done()
			return nil
		},
		effect: func(*env) bool {
			return r.each(oldAfter, func(u *keyUse) bool { return u.sent >= minAfterBound })
		},
		fired: func(*env) int64 {
			r.mu.Lock()
			defer r.mu.Unlock()
			return int64(sum(r.oldAfter).unauthorized)
		},
		extra: r.checks,
	}
}

func init() { registry = append(registry, rotationScenario) }
