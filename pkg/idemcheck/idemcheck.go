// Package idemcheck checks, black-box, that an HTTP API keeps the
// Idempotency-Key promises of the IETF draft (draft-ietf-httpapi-
// idempotency-key-header) and those the draft leaves to implementations.
// It needs no access to the API's code or database: every case sends real
// requests and then reads the effects back through the API itself (a list
// filtered by a value unique to the case), because a status code can lie:
// a server that answers 201 twice may have made two effects, or none.
//
// The cases:
//   - missing_key: a request without a key is refused (4xx), with no effect.
//   - key_too_long: a key one longer than the documented maximum is
//     refused, with no effect; one of the maximum is taken.
//   - replay: a request sent again with its key gets the first answer,
//     status and body byte for byte, and one effect.
//   - other_body: the key reused with another body is refused (4xx); only
//     the first body has an effect.
//   - in_flight: a second request while the first is being processed gets
//     the first's answer or a refusal (409), never a second effect.
//   - concurrent: N identical requests at once make one effect, and every
//     success carries the same body.
//   - timeout_retry: a request abandoned by the client before its answer,
//     then retried with its key, makes one effect.
//   - other_region: the retry sent to another region's URL (the second URL
//     given) gets the first answer or a refusal, and one effect.
//   - other_resource: the key reused on another resource never returns the
//     first resource's answer.
//   - expiry: after the documented expiry the key is free again (run only
//     when the expiry is within the wait allowed).
//
// Configuration is a small YAML file (Config); a shipped one for paymesh is
// deploy/idemcheck/paymesh.yaml.
package idemcheck

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Verdict is a case's outcome.
type Verdict string

// The verdicts.
const (
	Pass Verdict = "PASS"
	Fail Verdict = "FAIL"
	Skip Verdict = "SKIP"
)

// Result is one case's verdict and why.
type Result struct {
	Case    string
	Verdict Verdict
	Detail  string
}

// Options are the run's settings beside the config.
type Options struct {
	// URLs are the API's base URLs: the first is where the cases send;
	// a second (another region of the same API) is where other_region
	// sends its retry.
	URLs []string
	// MaxWait is the longest the expiry case may wait for a key to
	// expire (0: it skips unless the config has no expiry to wait for).
	MaxWait time.Duration
	// HTTP is the client (default: one with a 30 s timeout).
	HTTP *http.Client
}

// checker is one run against one API.
type checker struct {
	cfg  Config
	opts Options
	http *http.Client
	seq  int
	run  string // a value unique to the run, in every key and {{unique}}
}

// caseFunc runs one case.
type caseFunc func(ctx context.Context, c *checker) Result

// cases are run in this order.
var cases = []struct {
	name string
	run  caseFunc
}{
	{"missing_key", missingKey},
	{"key_too_long", keyTooLong},
	{"replay", replay},
	{"other_body", otherBody},
	{"in_flight", inFlight},
	{"concurrent", concurrent},
	{"timeout_retry", timeoutRetry},
	{"other_region", otherRegion},
	{"other_resource", otherResource},
	{"expiry", expiry},
}

// Run runs every case against the API and writes a line per case and a
// summary to out. It returns the results; a caller exits non-zero when one
// failed (Failed).
func Run(ctx context.Context, cfg Config, opts Options, out io.Writer) []Result {
	c := &checker{cfg: cfg, opts: opts, http: opts.HTTP, run: fmt.Sprintf("%x", time.Now().UnixNano())}
	if c.http == nil {
		c.http = &http.Client{Timeout: 30 * time.Second}
	}
	var results []Result
	n := map[Verdict]int{}
	for _, tc := range cases {
		r := tc.run(ctx, c)
		r.Case = tc.name
		results = append(results, r)
		n[r.Verdict]++
		fmt.Fprintf(out, "%-4s  %-14s %s\n", r.Verdict, r.Case, r.Detail)
	}
	fmt.Fprintf(out, "idemcheck %s: %d PASS, %d FAIL, %d SKIP\n", opts.URLs[0], n[Pass], n[Fail], n[Skip])
	return results
}

// Failed reports whether a result is a FAIL.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Verdict == Fail {
			return true
		}
	}
	return false
}

func pass(format string, a ...any) Result {
	return Result{Verdict: Pass, Detail: fmt.Sprintf(format, a...)}
}
func fail(format string, a ...any) Result {
	return Result{Verdict: Fail, Detail: fmt.Sprintf(format, a...)}
}
func skip(format string, a ...any) Result {
	return Result{Verdict: Skip, Detail: fmt.Sprintf(format, a...)}
}

func itoa(n int) string { return fmt.Sprint(n) }
