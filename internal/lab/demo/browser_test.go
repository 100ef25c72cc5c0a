package demo_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/internal/lab/demo"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/syncbuf"
	"github.com/paymesh/paymesh/pkg/natstrace"
)

// tracesListed is how many of the recorder's traces the page lists.
const tracesListed = 100

// waitUntil polls cond every 100 ms until it holds, for at most timeout or
// until ctx ends, and reports whether it held.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return cond()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return true
}

// chromium finds Debian's Chromium. Without it the test is skipped, unless
// PAYMESH_REQUIRE_BROWSER is set (CI sets it, after installing chromium).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "/usr/bin/chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("PAYMESH_REQUIRE_BROWSER") != "" {
		t.Fatal("chromium is not installed (apt-get install chromium); PAYMESH_REQUIRE_BROWSER is set")
	}
	t.Skip("chromium is not installed (apt-get install chromium): the browser test needs it")
	return ""
}

// watchPageErrors collects the exceptions the page's script throws and the
// errors it logs, from now on.
func watchPageErrors(t *testing.T, browser context.Context) func() []string {
	t.Helper()
	var mu sync.Mutex
	var errs []string
	err := chromedp.Listen(browser, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg = fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, d.Text)
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type != runtime.ConsoleAPICalledTypeError {
				return
			}
			msg = "console.error:"
			for _, a := range ev.Args {
				msg += " " + string(a.Value)
			}
		default:
			return
		}
		mu.Lock()
		errs = append(errs, msg)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(errs)
	}
}

// TestLivePageInBrowser runs a short demo with its live page, opens the page
// in headless Chromium while transfers flow (through the routers and the
// HTTP APIs, then the holds and refunds), and checks that the charts
// get data, that a trace with a redelivery opens as a span tree naming the
// dedup layer that caught it, that the final invariants show PASS, and
// that the Alerts panel shows the dead-letter alert the poison messages
// fire (or, without Prometheus, that alerts are off), and that no part of
// the page ever failed to update or threw. It saves a
// screenshot (go test -artifacts keeps it).
func TestLivePageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("a demo run in a browser")
	}
	exe := chromium(t)
	rec := dashboard.NewRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithIDGenerator(natstrace.IDGenerator{})))

	// Bounds the whole test: a loaded machine runs the demo (1500 transfers
	// at 250/s at most) in two minutes or more.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	urls := make(chan string, 1)
	out := &syncbuf.Buffer{}
	var wg sync.WaitGroup
	var rep demo.Report
	var runErr error
	wg.Go(func() {
		rep, runErr = demo.Run(runCtx, demo.Config{
			PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmtest_demo_web_%d_", os.Getpid()),
			Accounts: 5, Transfers: 1500, Rate: 250, Seed: 11, HTTPShare: 0.1,
			ClientRetry: 0.05, ProducerRetry: 0.1, DropAck: 0.3, Poison: 0.01, HookLoss: 0.05, Stay: true, Prometheus: prometheusMode(),
			// Every kind of traffic: a tenth of the transfers through the HTTP
			// API (applied by the API itself where they are homed) and the
			// holds-and-refunds phase, all through the APIs.
			Holds: 30, Refunds: 15,
			Dashboard: "127.0.0.1:0", Traces: rec, OnDashboard: func(u string) { urls <- u },
		}, out)
		if runErr != nil {
			select {
			case urls <- "":
			default:
			}
		}
	})
	defer func() {
		stop()
		wg.Wait()
	}()
	var url string
	select {
	case url = <-urls:
	case <-ctx.Done():
	}
	if url == "" {
		wg.Wait()
		t.Fatalf("the demo did not serve its page: %v\n%s", runErr, out.String())
	}

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.Flag("disable-background-networking", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1800))
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	pageErrs := watchPageErrors(t, browser)

	wait := func(what, js string, timeout time.Duration) {
		t.Helper()
		if _, err := chromedp.Run(browser, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(timeout))); err != nil {
			t.Fatalf("page: %s: %v\ndemo output:\n%s", what, err, out.String())
		}
	}
	if err := chromedp.Do(browser, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	// While the transfers flow: each region's throughput line has points
	// and has been above zero, and some layer has caught duplicates.
	wait("throughput chart gets data", `[...document.querySelectorAll('#chart-throughput polyline.series')].filter(p => +p.dataset.n >= 3 && +p.dataset.max > 0).length === 3`, 2*time.Minute)
	wait("duplicates chart gets data", `[...document.querySelectorAll('#chart-duplicates polyline.series')].some(p => +p.dataset.max > 0)`, 2*time.Minute)
	// The webhook receiver's chart: deliveries, and duplicates among them
	// (the answers the demo's relay loses), with their rate.
	wait("the webhook chart shows deliveries, duplicates and their rate", `!document.getElementById('webhooks-card').hidden && `+
		`[...document.querySelectorAll('#chart-webhooks polyline.series')].filter(p => +p.dataset.max > 0).length === 2 && `+
		`+document.getElementById('webhook-rate').textContent > 0`, 2*time.Minute)
	// The dropped acks (30 % of the batches) redeliver messages from the
	// start of the run: wait until the recorder keeps such a trace among
	// the newest it lists, then for the page to list it.
	listed := func() bool {
		for i, s := range rec.Traces() {
			if i < tracesListed && slices.Contains(s.Reasons, "redelivery") {
				return true
			}
		}
		return false
	}
	if !waitUntil(ctx, 3*time.Minute, listed) {
		t.Fatalf("no trace with a redelivery among the %d newest the recorder keeps after 3 minutes\ndemo output:\n%s", tracesListed, out.String())
	}
	wait("a trace with a redelivery is listed", `[...document.querySelectorAll('#traces li[data-trace]')].some(li => li.textContent.includes('redelivery'))`, time.Minute)

	traceID, err := chromedp.Run(browser, chromedp.Evaluate[string](`(() => {
		// Prefer a trace across regions.
		const all = [...document.querySelectorAll('#traces li[data-trace]')].filter(li => li.textContent.includes('redelivery'));
		const li = all.find(li => li.querySelectorAll('.tag.region').length > 1) || all[0];
		li.click();
		return li.dataset.trace;
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	wait("the trace opens as a span tree", `document.getElementById('trace-id').textContent === '`+traceID+`' && document.querySelectorAll('#span-tree .span').length >= 2`, 10*time.Second)
	wait("a span names the dedup layer that caught the duplicate", `document.querySelector('#span-tree [data-layer]') !== null`, 10*time.Second)
	wait("the redelivery links to its first attempt", `[...document.querySelectorAll('#span-tree a')].some(a => a.textContent.includes('first attempt'))`, 10*time.Second)
	// After the run: the final invariants across regions.
	wait("final invariants PASS", `document.getElementById('invariant-badge').textContent.includes('PASS') && document.getElementById('invariant-badge').textContent.includes('final')`, 4*time.Minute)

	// The Alerts panel: its heading, and the dead-letter alert firing in
	// its table, or the note saying alerts are off.
	wait("the Alerts panel is drawn", `document.querySelector('#alerts-card h2').textContent.startsWith('Alerts') && document.querySelectorAll('#alerts-cleared tbody tr').length >= 1`, 10*time.Second)
	if prometheusMode() == demo.PrometheusOn {
		wait("the dead-letter alert fires on the page", `[...document.querySelectorAll('#alerts tbody tr[data-alert="PaymeshDeadLettersGrowing"][data-state="firing"]')].some(tr => tr.textContent.includes('dlq') && tr.querySelector('.tag.region'))`, time.Minute)
		wait("the note names Prometheus", `document.getElementById('alerts-note').textContent.startsWith('alerts: Prometheus http://')`, 10*time.Second)
	} else {
		wait("the note says alerts are off", `document.getElementById('alerts-note').textContent === 'alerts: off (prometheus not installed; make prometheus)'`, 10*time.Second)
	}

	// No part of the page failed to update at any time, and the script
	// threw nothing.
	wait("the page drew every update", `document.body.dataset.errors === undefined && document.getElementById('page-error').hidden`, 10*time.Second)
	if errs := pageErrs(); len(errs) > 0 {
		t.Fatalf("the page's script failed:\n%s", strings.Join(errs, "\n"))
	}

	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(t.ArtifactDir(), "dashboard.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	stop()
	wg.Wait()
	if runErr != nil || !rep.OK() {
		t.Fatalf("demo: %v\n%s", runErr, out.String())
	}
}
