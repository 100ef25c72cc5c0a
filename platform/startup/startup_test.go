package startup_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/platform/startup"
)

// TestWait: an attempt that succeeds after failures ends the wait, logged
// once; a permanent error ends it at once; the time running out gives a
// *Timeout with the last error; ctx ending gives ctx's error.
func TestWait(t *testing.T) {
	ctx := context.Background()
	down := errors.New("connection refused")
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))

	tries := 0
	if err := startup.Wait(ctx, time.Minute, log, "waiting for x", func() error {
		if tries++; tries < 4 {
			return down
		}
		return nil
	}); err != nil || tries != 4 {
		t.Fatalf("up at the 4th try: got %v after %d tries", err, tries)
	}
	if n := strings.Count(logs.String(), "waiting for x"); n != 1 {
		t.Errorf("logged the wait %d times, want once:\n%s", n, logs.String())
	}

	refused := errors.New("password authentication failed")
	start := time.Now()
	if err := startup.Wait(ctx, time.Minute, nil, "", func() error { return startup.Permanent(refused) }); !errors.Is(err, refused) || time.Since(start) > time.Second {
		t.Fatalf("permanent: got %v after %s, want it at once", err, time.Since(start))
	}

	var late *startup.Timeout
	if err := startup.Wait(ctx, 600*time.Millisecond, nil, "", func() error { return down }); !errors.As(err, &late) || late.After != 600*time.Millisecond || !errors.Is(err, down) {
		t.Fatalf("never up: got %v, want a *Timeout of 600ms wrapping the last error", err)
	}

	tries = 0
	if err := startup.Wait(ctx, 0, nil, "", func() error { tries++; return down }); !errors.Is(err, down) || errors.As(err, &late) || tries != 1 {
		t.Fatalf("no timeout: got %v after %d tries, want the one attempt's error", err, tries)
	}

	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := startup.Wait(cctx, time.Minute, nil, "", func() error { return down }); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), down.Error()) {
		t.Fatalf("ctx ends: got %v, want its deadline with the last error", err)
	}
}
