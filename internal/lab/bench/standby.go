package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgha"
)

// StandbyRun is the standby scenario's result: the uniform run and the API
// run on a pg_auto_failover primary alone, then on the same primary with
// its synchronous standby, so that a COMMIT waits for the standby's flush.
// Both halves run on the same server and data folder, so the ratios are
// what the standby costs and nothing else (the single-server runs of the
// invocation run on the machine's own Postgres, whose settings differ).
type StandbyRun struct {
	Alone, WithStandby       LedgerRun
	APIAlone, APIWithStandby APIRun
	// UniformRatio and APIRatio are the rate with the standby over the
	// rate alone.
	UniformRatio float64 `json:"uniform_ratio"`
	APIRatio     float64 `json:"api_ratio"`
	// StandbySeconds is how long the standby took to be made (its base
	// backup) and to become synchronous.
	StandbySeconds float64 `json:"standby_seconds"`
}

func (s StandbyRun) line() string {
	return fmt.Sprintf("%-13s uniform %.0f/s alone, %.0f/s with a synchronous standby (%.2fx; p99 %.1f → %.1f ms); api %.0f/s → %.0f/s (%.2fx; p99 %.1f → %.1f ms); standby made in %.1fs  %s",
		Standby, s.Alone.Rate, s.WithStandby.Rate, s.UniformRatio, s.Alone.P99Ms, s.WithStandby.P99Ms,
		s.APIAlone.Rate, s.APIWithStandby.Rate, s.APIRatio, s.APIAlone.P99Ms, s.APIWithStandby.P99Ms, s.StandbySeconds,
		invariants(s.Alone.Verified && s.WithStandby.Verified && s.APIAlone.Verified && s.APIWithStandby.Verified,
			s.Alone.VerifyReport+s.WithStandby.VerifyReport+s.APIAlone.VerifyReport+s.APIWithStandby.VerifyReport))
}

// standby measures StandbyRun on a formation of its own; the bench's
// other runs keep the machine's Postgres.
func (e *env) standby(ctx context.Context) (StandbyRun, error) {
	var run StandbyRun
	f, err := pgha.Start(ctx, pgha.Options{Nodes: 1})
	if err != nil {
		return run, err
	}
	defer f.Stop()
	saved := e.cfg.PostgresURL
	e.cfg.PostgresURL = f.URL("postgres")
	defer func() { e.cfg.PostgresURL = saved }()
	measure := func(suffix string) (LedgerRun, APIRun, error) {
		u, rig, _, err := e.uniformRun(ctx, Standby+suffix, e.cfg.BatchSize, false, 0, e.cfg.Limit, "")
		if err != nil {
			return u, APIRun{}, err
		}
		rig.close(ctx)
		a, err := e.api(ctx, e.cfg.APIConcurrency[0])
		return u, a, err
	}
	if run.Alone, run.APIAlone, err = measure("-alone"); err != nil {
		return run, err
	}
	began := time.Now()
	if _, err := f.AddNode(ctx); err != nil {
		return run, err
	}
	run.StandbySeconds = time.Since(began).Seconds()
	if run.WithStandby, run.APIWithStandby, err = measure("-sync"); err != nil {
		return run, err
	}
	if run.Alone.Rate > 0 {
		run.UniformRatio = run.WithStandby.Rate / run.Alone.Rate
	}
	if run.APIAlone.Rate > 0 {
		run.APIRatio = run.APIWithStandby.Rate / run.APIAlone.Rate
	}
	return run, nil
}
