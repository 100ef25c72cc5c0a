package loadgen_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/lab/loadgen"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy/faultproxytest"
	"github.com/paymesh/paymesh/internal/testbed/syncbuf"
)

func TestParsePlan(t *testing.T) {
	links := []string{"eu", "us", "ap"}
	good := map[string]string{
		"cut-us@10s+5s,degrade-us@20s+15s":    "cut-us@10s+5s,degrade-us@20s+15s",
		" degrade-ap@1m+1s , cut-eu@0s+500ms": "cut-eu@0s+500ms,degrade-ap@1m0s+1s", // sorted by start
		"cut-us@0s+5s,degrade-us@1s+5s":       "cut-us@0s+5s,degrade-us@1s+5s",      // kinds may overlap
		"default":                             "cut-us@5s+5s,degrade-us@15s+10s",
	}
	for in, want := range good {
		p, err := loadgen.ParsePlan(in, links)
		if err != nil || p.String() != want {
			t.Errorf("ParsePlan(%q): got %q, %v; want %q", in, p, err, want)
		}
	}
	if p, err := loadgen.ParsePlan("default", []string{"ap", "eu"}); err != nil || p.String() != "cut-ap@5s+5s,degrade-ap@15s+10s" {
		t.Errorf("default without us: got %q, %v", p, err)
	}
	bad := map[string]string{
		"":                             "want <kind>-<region>@<start>+<duration>",
		"cut-us":                       "want <kind>-<region>@",
		"cutus@1s+1s":                  "want <kind>-<region>@",
		"cut-us@1s":                    "want <kind>-<region>@",
		"melt-us@1s+1s":                `unknown kind "melt"`,
		"cut-mars@1s+1s":               `no WAN link for region "mars"`,
		"cut-us@soon+1s":               `start "soon"`,
		"cut-us@1s+long":               `duration "long"`,
		"cut-us@-1s+1s":                "start -1s is negative",
		"cut-us@1s+0s":                 "duration 0s: want more than 0",
		"cut-us@1s+5s,cut-us@3s+1s":    "overlaps cut-us@1s+5s",
		"cut-us@1s+1s,,cut-eu@1s+1s":   `item ""`,
		"degrade-eu@0s+2s,cut-us@zzz+": `start "zzz"`,
	}
	for in, want := range bad {
		if p, err := loadgen.ParsePlan(in, links); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePlan(%q): got %q, %v; want an error containing %q", in, p, err, want)
		}
	}
	if _, err := loadgen.ParsePlan("default", nil); err == nil || !strings.Contains(err.Error(), "no WAN links") {
		t.Errorf("no links: got %v", err)
	}
}

// link is a faultproxy with its control API.
func link(t *testing.T) (*faultproxy.Proxy, *faultproxy.Client) {
	t.Helper()
	p, err := faultproxy.New(faultproxytest.Echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	srv := httptest.NewServer(faultproxy.Handler(p))
	t.Cleanup(srv.Close)
	return p, faultproxy.NewClient(srv.URL)
}

// TestRunPlan runs a plan against two real links through their control
// APIs: eu is cut then healed, us degraded then restored to the shape it
// had; a plan cut short by its context heals what is in force and skips the
// rest.
func TestRunPlan(t *testing.T) {
	eu, euCtl := link(t)
	us, usCtl := link(t)
	shape := faultproxy.Shape{Latency: 5 * time.Millisecond, Jitter: time.Millisecond}
	us.SetShape(shape)
	plan, err := loadgen.ParsePlan("cut-eu@0s+300ms,degrade-us@100ms+400ms", []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- loadgen.RunPlan(context.Background(), plan, map[string]*faultproxy.Client{"eu": euCtl, "us": usCtl}, &out)
	}()
	faultproxytest.WaitFor(t, func() bool { return eu.Status().Cut })
	degraded := faultproxy.Shape{Latency: 20 * time.Millisecond, Jitter: time.Millisecond, ResetRate: 2}
	faultproxytest.WaitFor(t, func() bool { return us.Shape() == degraded })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if eu.Status().Cut || us.Shape() != shape {
		t.Fatalf("after the plan: eu %+v, us %v; want eu healed and us restored to %v", eu.Status(), us.Shape(), shape)
	}
	for _, want := range []string{"fault cut-eu@0s+300ms: eu link cut", "fault cut-eu@0s+300ms: eu link healed",
		"fault degrade-us@100ms+400ms: us link degraded from latency 5ms jitter 1ms reset_rate 0/s to latency 20ms jitter 1ms reset_rate 2/s",
		"fault degrade-us@100ms+400ms: us link restored to latency 5ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// Cut short: the cut in force heals at once, the later degrade never
	// fires.
	plan, err = loadgen.ParsePlan("cut-eu@0s+1h,degrade-us@1h+1s", []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out = syncbuf.Buffer{}
	go func() {
		done <- loadgen.RunPlan(ctx, plan, map[string]*faultproxy.Client{"eu": euCtl, "us": usCtl}, &out)
	}()
	faultproxytest.WaitFor(t, func() bool { return eu.Status().Cut })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if eu.Status().Cut || us.Shape() != shape {
		t.Fatalf("after the plan was cut short: eu %+v, us %v", eu.Status(), us.Shape())
	}
	for _, want := range []string{"eu link healed early (the run ended)", "fault degrade-us@1h0m0s+1s: skipped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// A control API that does not answer is an error.
	err = loadgen.RunPlan(context.Background(), loadgen.Plan{{Kind: "cut", Region: "eu", Duration: time.Millisecond}},
		map[string]*faultproxy.Client{"eu": faultproxy.NewClient("http://127.0.0.1:1")}, &out)
	if err == nil || !strings.Contains(err.Error(), "fault cut-eu@0s+1ms: fire") {
		t.Fatalf("unreachable control API: got %v", err)
	}
}
