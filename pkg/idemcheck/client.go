package idemcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// uniqueMark is replaced, in a request body and the effects path, by the
// case's own value.
const uniqueMark = "{{unique}}"

// answer is what one request got.
type answer struct {
	Status int
	Body   []byte
	Err    error // the request failed (no answer)
}

func (a answer) String() string {
	if a.Err != nil {
		return "no answer (" + a.Err.Error() + ")"
	}
	body := string(a.Body)
	if len(body) > 120 {
		body = body[:120] + "…"
	}
	return fmt.Sprintf("%d %s", a.Status, strings.TrimSpace(body))
}

func (a answer) ok() bool      { return a.Err == nil && a.Status >= 200 && a.Status < 300 }
func (a answer) refused() bool { return a.Err == nil && a.Status >= 400 && a.Status < 500 }

// unique returns a value new to the run, for a case's {{unique}} or key.
func (c *checker) unique(what string) string {
	c.seq++
	return fmt.Sprintf("idemcheck-%s-%s-%d", what, c.run, c.seq)
}

// send sends req to base with the body's {{unique}} set to u and the key
// (none when key is "").
func (c *checker) send(ctx context.Context, base string, req Request, u, key string) answer {
	body := strings.ReplaceAll(req.Body, uniqueMark, u)
	r, err := http.NewRequestWithContext(ctx, req.Method, strings.TrimRight(base, "/")+req.Path, strings.NewReader(body))
	if err != nil {
		return answer{Err: err}
	}
	r.Header.Set("Content-Type", "application/json")
	for k, v := range c.cfg.Headers {
		r.Header.Set(k, v)
	}
	if key != "" {
		r.Header.Set(c.cfg.Key.Header, key)
	}
	resp, err := c.http.Do(r)
	if err != nil {
		return answer{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{Status: resp.StatusCode, Body: b, Err: err}
}

// count returns how many effects u has, read back through the API.
func (c *checker) count(ctx context.Context, u string) (int, error) {
	path := strings.ReplaceAll(c.cfg.Effects.Path, uniqueMark, url.QueryEscape(u))
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.opts.URLs[0], "/")+path, nil)
	if err != nil {
		return 0, err
	}
	for k, v := range c.cfg.Headers {
		r.Header.Set(k, v)
	}
	resp, err := c.http.Do(r)
	if err != nil {
		return 0, fmt.Errorf("read back %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("read back %s: %d %s", path, resp.StatusCode, bytes.TrimSpace(b))
	}
	var items []json.RawMessage
	if c.cfg.Effects.Items == "" {
		err = json.Unmarshal(b, &items)
	} else {
		var obj map[string]json.RawMessage
		if err = json.Unmarshal(b, &obj); err == nil {
			err = json.Unmarshal(obj[c.cfg.Effects.Items], &items)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("read back %s: no JSON array at %q: %w", path, c.cfg.Effects.Items, err)
	}
	return len(items), nil
}

// effects watches u's effects for the settle time and returns the most
// seen. It returns early once more than want are seen (a double effect
// needs no more waiting), and waits the whole time otherwise, so that an
// effect applied late (an asynchronous API) is counted.
func (c *checker) effects(ctx context.Context, u string, want int) (int, error) {
	deadline := time.Now().Add(time.Duration(c.cfg.Settle))
	most := 0
	for {
		n, err := c.count(ctx, u)
		if err != nil {
			return 0, err
		}
		most = max(most, n)
		if most > want || time.Now().After(deadline) {
			return most, nil
		}
		select {
		case <-ctx.Done():
			return most, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// oneEffect checks that u has exactly one effect, with a Result for
// the case when not (ok false).
func (c *checker) oneEffect(ctx context.Context, u string) (Result, bool) {
	n, err := c.effects(ctx, u, 1)
	switch {
	case err != nil:
		return fail("%v", err), false
	case n != 1:
		return fail("%d effects read back, want 1", n), false
	}
	return Result{}, true
}

// noEffect checks that u has no effect.
func (c *checker) noEffect(ctx context.Context, u string) (Result, bool) {
	n, err := c.effects(ctx, u, 0)
	switch {
	case err != nil:
		return fail("%v", err), false
	case n != 0:
		return fail("%d effects read back, want none", n), false
	}
	return Result{}, true
}
