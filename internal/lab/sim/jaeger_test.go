package sim

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/paymesh/paymesh/internal/testbed/syncbuf"
)

// TestJaegerHoldsExportedSpans: the jaeger binary the simulation runs,
// started with compose's config (deploy/jaeger/config.yaml) and its listen
// addresses moved by the variables the simulation sets, receives a span
// over OTLP/HTTP from the exporter the services use, and its query API
// returns the trace with the span's service (findTrace). A trace never
// sent is not found. The binary is built by `make jaeger` or a full
// `make sim` (minutes, cold); without it the test skips, unless
// PAYMESH_REQUIRE_JAEGER=1.
func TestJaegerHoldsExportedSpans(t *testing.T) {
	ctx := context.Background()
	bin := jaegerBinary(t)
	addrs := map[string]string{}
	for v := range jaegerListenEnv {
		addrs[v] = freeAddr(t)
	}
	cmd := exec.Command(bin, "--config="+filepath.Join(root(t), "deploy", "jaeger", "config.yaml"))
	cmd.Env = os.Environ()
	for v, a := range addrs {
		cmd.Env = append(cmd.Env, v+"="+a)
	}
	var log syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitHTTP(t, "http://"+addrs["JAEGER_HEALTH_LISTEN"]+"/status", &log)

	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(addrs["JAEGER_OTLP_HTTP_LISTEN"]), otlptracehttp.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("paymesh-ledger-test"))))
	_, span := tp.Tracer("sim-test").Start(ctx, "apply batch")
	id := span.SpanContext().TraceID().String()
	span.End()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	query := "http://" + addrs["JAEGER_QUERY_LISTEN"]
	var got TraceFound
	deadline := time.Now().Add(time.Minute)
	for {
		if got, err = findTrace(ctx, query, id); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("trace %s not in Jaeger: %v\n%s", id, err, log.String())
	}
	if got.Spans != 1 || len(got.Services) != 1 || got.Services[0] != "paymesh-ledger-test" {
		t.Errorf("trace %s: got %d spans from %v, want 1 from paymesh-ledger-test", id, got.Spans, got.Services)
	}
	if _, err := findTrace(ctx, query, "0af7651916cd43dd8448eb211c80319c"); err == nil {
		t.Error("a trace never sent: found, want an error")
	}
}

// jaegerBinary returns the built jaeger binary, skipping the test when it
// is not built (unless PAYMESH_REQUIRE_JAEGER=1).
func jaegerBinary(t *testing.T) string {
	t.Helper()
	path, _, err := jaegerPath(context.Background(), root(t), filepath.Join(root(t), "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("PAYMESH_REQUIRE_JAEGER") == "1" {
			t.Fatalf("PAYMESH_REQUIRE_JAEGER=1 but %s is not built (make jaeger)", path)
		}
		t.Skipf("%s is not built (make jaeger builds it)", path)
	}
	return path
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// waitHTTP waits until url answers 200, failing with the process's log.
func waitHTTP(t *testing.T, url string, log *syncbuf.Buffer) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not answering 200 after a minute (%v)\n%s", url, err, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
