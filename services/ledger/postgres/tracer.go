package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// queryTracer makes every statement a client span of the caller's trace
// (pgx.QueryTracer, pgx.BatchTracer). With the global no-op provider it
// costs next to nothing.
type queryTracer struct{}

type spanKey struct{}

func startQuery(ctx context.Context, name, sql string) context.Context {
	if len(sql) > 300 {
		sql = sql[:300] + "…"
	}
	ctx, span := otel.Tracer("github.com/paymesh/paymesh/services/ledger/postgres").Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.system.name", "postgresql"), attribute.String("db.query.text", sql)))
	return context.WithValue(ctx, spanKey{}, span)
}

func endQuery(ctx context.Context, err error) {
	span, ok := ctx.Value(spanKey{}).(trace.Span)
	if !ok {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// TraceQueryStart starts a statement's span.
func (queryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return startQuery(ctx, "db.query", d.SQL)
}

// TraceQueryEnd ends it.
func (queryTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	endQuery(ctx, d.Err)
}

// TraceBatchStart starts a pipelined batch's span.
func (queryTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	return startQuery(ctx, "db.batch", "")
}

// TraceBatchQuery records one statement of a batch as an event.
func (queryTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if span, ok := ctx.Value(spanKey{}).(trace.Span); ok {
		sql := d.SQL
		if len(sql) > 120 {
			sql = sql[:120] + "…"
		}
		span.AddEvent("db.batch.query", trace.WithAttributes(attribute.String("db.query.text", sql)))
	}
}

// TraceBatchEnd ends the batch's span.
func (queryTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	endQuery(ctx, d.Err)
}
