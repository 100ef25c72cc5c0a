package postgres_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// TestQueryTracing: statements on a ledger pool are spans of the caller's
// trace.
func TestQueryTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	_, url := pgtest.MustDatabase(t, postgres.Migrations()...)
	pool, err := postgres.Connect(context.Background(), url, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, parent := otel.Tracer("test").Start(context.Background(), "caller")
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	parent.End()
	var found bool
	for _, s := range rec.Ended() {
		if s.Name() == "db.query" && s.Parent().SpanID() == parent.SpanContext().SpanID() {
			found = true
		}
	}
	if !found {
		t.Fatal("no db.query span under the caller's span")
	}
}
