package ledgerstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/platform/telemetry"
)

// Limits bounds a stream's size. A stream at either bound refuses the next
// publish (jetstream.DiscardNew): its publisher gets an error and keeps or
// retries the command, and no message already acknowledged is dropped to
// make room. A zero field takes the default of the stream it bounds.
type Limits struct {
	// MaxMsgs is the most messages the stream holds.
	MaxMsgs int64
	// MaxBytes is the most bytes the stream's messages take (subjects,
	// headers and payloads). JetStream reserves it, times the replicas,
	// out of the server's max_file_store when it creates the stream.
	MaxBytes int64
}

// Default stream limits. A command takes about 600 bytes with its headers,
// so MaxMsgs binds first; docs/RELIABILITY.md ("Stream limits") gives the
// time each leaves before a stream is full, and why PaymeshConsumerLag
// fires long before.
var (
	// DefaultLimits bounds the ledger and route streams: four million
	// commands waiting for their consumer (over four minutes of the
	// fastest measured inflow).
	DefaultLimits = Limits{MaxMsgs: 4_000_000, MaxBytes: 4 << 30}
	// DefaultDLQLimits bounds the dead-letter stream.
	DefaultDLQLimits = Limits{MaxMsgs: 100_000, MaxBytes: 256 << 20}
)

// ErrLimits is returned for stream limits below zero.
var ErrLimits = errors.New("stream limits: want 0 (the default) or more")

// CheckLimits returns an error wrapping ErrLimits unless both of l's
// bounds are 0 or more.
func CheckLimits(l Limits) error {
	if l.MaxMsgs < 0 || l.MaxBytes < 0 {
		return fmt.Errorf("%w: got %d messages, %d bytes", ErrLimits, l.MaxMsgs, l.MaxBytes)
	}
	return nil
}

// Or returns l with each zero field taken from d.
func (l Limits) Or(d Limits) Limits {
	if l.MaxMsgs == 0 {
		l.MaxMsgs = d.MaxMsgs
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = d.MaxBytes
	}
	return l
}

// Apply sets cfg's size bounds to l and makes a full stream refuse new
// messages; it takes away any age limit, so that a message leaves only when
// its stream's retention says it was consumed.
func (l Limits) Apply(cfg jetstream.StreamConfig) jetstream.StreamConfig {
	cfg.MaxMsgs, cfg.MaxBytes = l.MaxMsgs, l.MaxBytes
	cfg.MaxAge = 0
	cfg.Discard = jetstream.DiscardNew
	return cfg
}

// FillOf returns a reader of how full stream is, for
// telemetry.ObserveFill; it returns JetStream's error when the stream
// cannot be read.
func FillOf(js jetstream.JetStream, stream string) telemetry.ReadFill {
	return func(ctx context.Context) (telemetry.Fill, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return telemetry.Fill{}, fmt.Errorf("fill of %s: %w", stream, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return telemetry.Fill{}, fmt.Errorf("fill of %s: %w", stream, err)
		}
		return telemetry.Fill{Msgs: int64(info.State.Msgs), Bytes: int64(info.State.Bytes),
			MaxMsgs: info.Config.MaxMsgs, MaxBytes: info.Config.MaxBytes}, nil
	}
}
