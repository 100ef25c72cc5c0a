package idemcheck

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"time"
)

func missingKey(ctx context.Context, c *checker) Result {
	if !c.cfg.Key.Required {
		return skip("the config says the key is optional here (key.required: false)")
	}
	u := c.unique("missing")
	a := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, "")
	if !a.refused() {
		return fail("without a key: %s, want a 4xx refusal", a)
	}
	if r, ok := c.noEffect(ctx, u); !ok {
		return r
	}
	return pass("refused with %d, no effect", a.Status)
}

func keyTooLong(ctx context.Context, c *checker) Result {
	u := c.unique("long")
	long := strings.Repeat("k", c.cfg.Key.MaxLength+1)
	a := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, long)
	if !a.refused() {
		return fail("a key of %d characters: %s, want a 4xx refusal", len(long), a)
	}
	if r, ok := c.noEffect(ctx, u); !ok {
		return r
	}
	u2 := c.unique("longest")
	key := c.unique("k")
	key += strings.Repeat("k", c.cfg.Key.MaxLength-len(key))
	if b := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u2, key[:c.cfg.Key.MaxLength]); !b.ok() {
		return fail("a key of %d characters (the maximum): %s, want it taken", c.cfg.Key.MaxLength, b)
	}
	if r, ok := c.oneEffect(ctx, u2); !ok {
		return r
	}
	return pass("%d characters refused with %d, no effect; %d taken", len(long), a.Status, c.cfg.Key.MaxLength)
}

func replay(ctx context.Context, c *checker) Result {
	u, key := c.unique("replay"), c.unique("key")
	a := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key)
	if !a.ok() {
		return fail("first request: %s, want a 2xx", a)
	}
	b := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key)
	if b.Status != a.Status || !bytes.Equal(a.Body, b.Body) {
		return fail("replay: %s, want the first answer byte for byte: %s", b, a)
	}
	if r, ok := c.oneEffect(ctx, u); !ok {
		return r
	}
	return pass("replayed %d with the same %d bytes, one effect", b.Status, len(b.Body))
}

func otherBody(ctx context.Context, c *checker) Result {
	u, u2, key := c.unique("body"), c.unique("otherbody"), c.unique("key")
	if a := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key); !a.ok() {
		return fail("first request: %s, want a 2xx", a)
	}
	b := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u2, key)
	if !b.refused() {
		return fail("the key with another body: %s, want a 4xx refusal (422 in the draft)", b)
	}
	if r, ok := c.oneEffect(ctx, u); !ok {
		return r
	}
	if r, ok := c.noEffect(ctx, u2); !ok {
		r.Detail = "the other body: " + r.Detail
		return r
	}
	return pass("refused with %d; only the first body has an effect", b.Status)
}

// together sends n copies of one request at once, released by one signal.
func (c *checker) together(ctx context.Context, n int, u, key string) []answer {
	out := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// sameOrInFlight checks a burst's answers: every success has the same
// status and body, every other answer is a 409 (in flight), and one at
// least succeeded.
func sameOrInFlight(as []answer) (Result, bool) {
	var first *answer
	conflicts := 0
	for i, a := range as {
		switch {
		case a.ok() && first == nil:
			first = &as[i]
		case a.ok():
			if a.Status != first.Status || !bytes.Equal(a.Body, first.Body) {
				return fail("two successes differ: %s and %s", first, a), false
			}
		case a.Status == http.StatusConflict:
			conflicts++
		default:
			return fail("an answer neither the first's nor 409: %s", a), false
		}
	}
	if first == nil {
		return fail("no request succeeded (%d of %d were 409)", conflicts, len(as)), false
	}
	return pass("%d same answers, %d refused as in flight", len(as)-conflicts, conflicts), true
}

func inFlight(ctx context.Context, c *checker) Result {
	u, key := c.unique("inflight"), c.unique("key")
	return c.burst(ctx, u, c.together(ctx, 2, u, key), "")
}

func concurrent(ctx context.Context, c *checker) Result {
	u, key := c.unique("concurrent"), c.unique("key")
	return c.burst(ctx, u, c.together(ctx, c.cfg.Concurrency, u, key), "of "+itoa(c.cfg.Concurrency)+" at once: ")
}

// burst judges requests sent at once: the effects read back first (one),
// then the answers (sameOrInFlight).
func (c *checker) burst(ctx context.Context, u string, as []answer, prefix string) Result {
	if e, ok := c.oneEffect(ctx, u); !ok {
		e.Detail = prefix + e.Detail
		return e
	}
	r, _ := sameOrInFlight(as)
	r.Detail = prefix + r.Detail
	if r.Verdict == Pass {
		r.Detail += ", one effect"
	}
	return r
}

func timeoutRetry(ctx context.Context, c *checker) Result {
	u, key := c.unique("timeout"), c.unique("key")
	cut, cancel := context.WithTimeout(ctx, time.Duration(c.cfg.Timeout))
	first := c.send(cut, c.opts.URLs[0], c.cfg.Request, u, key)
	cancel()
	// The retry: again while the server says the first is in flight.
	deadline := time.Now().Add(time.Duration(c.cfg.Settle) + 10*time.Second)
	var b answer
	for {
		b = c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key)
		if b.Status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !b.ok() {
		return fail("the retry after a cut request (%s): %s, want a 2xx", first, b)
	}
	if r, ok := c.oneEffect(ctx, u); !ok {
		return r
	}
	return pass("first cut after %s (%s); the retry got %d, one effect", time.Duration(c.cfg.Timeout), firstWord(first), b.Status)
}

func otherRegion(ctx context.Context, c *checker) Result {
	if len(c.opts.URLs) < 2 {
		return skip("one URL given; give another region's URL second")
	}
	u, key := c.unique("region"), c.unique("key")
	a := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key)
	if !a.ok() {
		return fail("first request: %s, want a 2xx", a)
	}
	b := c.send(ctx, c.opts.URLs[1], c.cfg.Request, u, key)
	switch {
	case b.Status == http.StatusUnauthorized || b.Status == http.StatusForbidden:
		return fail("the retry in %s was not let in (%s): the case proves nothing; give credentials valid in both regions", c.opts.URLs[1], b)
	case b.ok() && (b.Status != a.Status || !bytes.Equal(a.Body, b.Body)):
		return fail("the retry in %s: %s, want the first answer or a refusal: %s", c.opts.URLs[1], b, a)
	case !b.ok() && !b.refused():
		return fail("the retry in %s: %s, want the first answer or a refusal", c.opts.URLs[1], b)
	}
	if r, ok := c.oneEffect(ctx, u); !ok {
		return r
	}
	return pass("the retry in %s got %d (%s), one effect", c.opts.URLs[1], b.Status, map[bool]string{true: "the first answer", false: "refused"}[b.ok()])
}

func otherResource(ctx context.Context, c *checker) Result {
	if c.cfg.OtherResource == nil {
		return skip("no other_resource in the config")
	}
	u, key := c.unique("resource"), c.unique("key")
	a := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key)
	if !a.ok() {
		return fail("first request: %s, want a 2xx", a)
	}
	b := c.send(ctx, c.opts.URLs[0], *c.cfg.OtherResource, c.unique("other"), key)
	if b.ok() && bytes.Equal(a.Body, b.Body) {
		return fail("%s %s with the key got the first resource's answer: %s", c.cfg.OtherResource.Method, c.cfg.OtherResource.Path, b)
	}
	if !b.ok() && !b.refused() {
		return fail("%s %s with the key: %s, want its own answer or a refusal", c.cfg.OtherResource.Method, c.cfg.OtherResource.Path, b)
	}
	if r, ok := c.oneEffect(ctx, u); !ok {
		return r
	}
	return pass("%s %s with the key got %d, not the first resource's answer", c.cfg.OtherResource.Method, c.cfg.OtherResource.Path, b.Status)
}

func expiry(ctx context.Context, c *checker) Result {
	exp := time.Duration(c.cfg.Key.Expiry)
	switch {
	case exp == 0:
		return skip("keys are kept as long as their effect (key.expiry: 0)")
	case exp > c.opts.MaxWait:
		return skip("the expiry %s is longer than --max-wait %s", exp, c.opts.MaxWait)
	}
	u, u2, key := c.unique("expiry"), c.unique("expired"), c.unique("key")
	if a := c.send(ctx, c.opts.URLs[0], c.cfg.Request, u, key); !a.ok() {
		return fail("first request: %s, want a 2xx", a)
	}
	deadline := time.Now().Add(exp + time.Duration(c.cfg.Settle) + time.Minute)
	var b answer
	for time.Sleep(exp); ; time.Sleep(time.Second) {
		if b = c.send(ctx, c.opts.URLs[0], c.cfg.Request, u2, key); b.ok() || time.Now().After(deadline) {
			break
		}
	}
	if !b.ok() {
		return fail("the key after its expiry %s, with a new body: %s, want it taken", exp, b)
	}
	if r, ok := c.oneEffect(ctx, u2); !ok {
		return r
	}
	return pass("after %s the key was taken again (%d), one effect", exp, b.Status)
}

func firstWord(a answer) string {
	if a.Err != nil {
		return "abandoned"
	}
	return "answered " + itoa(a.Status)
}
