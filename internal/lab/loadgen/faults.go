package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
)

// The kinds of WAN fault a plan can hold.
const (
	// FaultCut cuts a region's link to the hub, then heals it.
	FaultCut = "cut"
	// FaultDegrade multiplies the link's latency by DegradeLatencyFactor and
	// sets DegradeResetRate, then restores the shape it had.
	FaultDegrade = "degrade"
)

// How a degrade fault shapes its link.
const (
	DegradeLatencyFactor = 4
	DegradeResetRate     = 2.0 // connection resets per second
)

// restoreWait bounds how long healing a fault may take once the run ends.
const restoreWait = 10 * time.Second

// Fault is one item of a fault plan: Kind on Region's link, from Start
// (after the plan starts) for Duration.
type Fault struct {
	Kind     string
	Region   string
	Start    time.Duration
	Duration time.Duration
}

// String formats the fault as a plan item: "cut-us@10s+5s".
func (f Fault) String() string {
	return fmt.Sprintf("%s-%s@%s+%s", f.Kind, f.Region, f.Start, f.Duration)
}

// Plan is a list of faults on WAN links, in start order.
type Plan []Fault

// String formats the plan as ParsePlan reads it.
func (p Plan) String() string {
	items := make([]string, len(p))
	for i, f := range p {
		items[i] = f.String()
	}
	return strings.Join(items, ",")
}

// DefaultPlan fires each kind of fault once on region's link within the
// first 30 seconds: a cut at 5 s for 5 s, and a degrade at 15 s for 10 s.
func DefaultPlan(region string) Plan {
	return Plan{
		{Kind: FaultCut, Region: region, Start: 5 * time.Second, Duration: 5 * time.Second},
		{Kind: FaultDegrade, Region: region, Start: 15 * time.Second, Duration: 10 * time.Second},
	}
}

// ParsePlan reads a fault plan: comma-separated items
// <kind>-<region>@<start>+<duration> such as "cut-us@10s+5s,degrade-us@20s+15s",
// or "default" for DefaultPlan on the first of regions ("us" when it is one
// of them). regions are those whose links the plan may name. It returns an
// error naming the item that is malformed, names an unknown kind or region,
// has a negative start or no duration, or overlaps an earlier fault of the
// same kind on the same link.
func ParsePlan(s string, regions []string) (Plan, error) {
	if len(regions) == 0 {
		return nil, errors.New("fault plan: no WAN links to apply it to")
	}
	if strings.TrimSpace(s) == "default" {
		r := regions[0]
		if slices.Contains(regions, "us") {
			r = "us"
		}
		return DefaultPlan(r), nil
	}
	var plan Plan
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		f, err := parseFault(item, regions)
		if err != nil {
			return nil, fmt.Errorf("fault plan item %q: %w", item, err)
		}
		for _, g := range plan {
			if g.Kind == f.Kind && g.Region == f.Region && f.Start < g.Start+g.Duration && g.Start < f.Start+f.Duration {
				return nil, fmt.Errorf("fault plan item %q: overlaps %s on the same link", item, g)
			}
		}
		plan = append(plan, f)
	}
	slices.SortStableFunc(plan, func(a, b Fault) int { return int(a.Start - b.Start) })
	return plan, nil
}

func parseFault(item string, regions []string) (Fault, error) {
	const want = "want <kind>-<region>@<start>+<duration>, such as cut-us@10s+5s"
	name, when, ok := strings.Cut(item, "@")
	if !ok {
		return Fault{}, errors.New(want)
	}
	kind, region, ok := strings.Cut(name, "-")
	if !ok {
		return Fault{}, errors.New(want)
	}
	if kind != FaultCut && kind != FaultDegrade {
		return Fault{}, fmt.Errorf("unknown kind %q (known: %s, %s)", kind, FaultCut, FaultDegrade)
	}
	if !slices.Contains(regions, region) {
		return Fault{}, fmt.Errorf("no WAN link for region %q (links: %s)", region, strings.Join(regions, ", "))
	}
	start, dur, ok := strings.Cut(when, "+")
	if !ok {
		return Fault{}, errors.New(want)
	}
	f := Fault{Kind: kind, Region: region}
	var err error
	if f.Start, err = time.ParseDuration(start); err != nil {
		return Fault{}, fmt.Errorf("start %q: want a duration such as 10s", start)
	}
	if f.Duration, err = time.ParseDuration(dur); err != nil {
		return Fault{}, fmt.Errorf("duration %q: want a duration such as 5s", dur)
	}
	if f.Start < 0 {
		return Fault{}, fmt.Errorf("start %s is negative", f.Start)
	}
	if f.Duration <= 0 {
		return Fault{}, fmt.Errorf("duration %s: want more than 0", f.Duration)
	}
	return f, nil
}

// Print writes the plan, one fault a line.
func (p Plan) Print(w io.Writer) {
	fmt.Fprintf(w, "fault plan (%d faults):\n", len(p))
	for _, f := range p {
		fmt.Fprintf(w, "  at %-6s %-8s %s's link for %s\n", f.Start, f.Kind, f.Region, f.Duration)
	}
}

// RunPlan applies the plan through the links' control APIs (links maps
// regions to their clients), writing a line as each fault fires and heals.
// It returns when every fault has healed or, once ctx ends, after healing
// the faults in force and skipping those not yet due. It returns the errors
// of the control API calls that failed, joined.
func RunPlan(ctx context.Context, plan Plan, links map[string]*faultproxy.Client, out io.Writer) error {
	start := time.Now()
	var mu sync.Mutex // serialises the lines and errs
	var errs []error
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%5.1fs] "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	fail := func(f Fault, what string, err error) {
		say("fault %s: %s failed: %v", f, what, err)
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, fmt.Errorf("fault %s: %s: %w", f, what, err))
	}
	for _, f := range plan {
		if _, ok := links[f.Region]; !ok {
			return fmt.Errorf("fault %s: no control API for region %q", f, f.Region)
		}
	}
	var wg sync.WaitGroup
	for _, f := range plan {
		cl := links[f.Region]
		wg.Go(func() {
			if !sleepUntil(ctx, start.Add(f.Start)) {
				say("fault %s: skipped (the run ended first)", f)
				return
			}
			h, err := fire(ctx, f, cl)
			if err != nil {
				fail(f, "fire", err)
				return
			}
			say("fault %s: %s", f, h.fired)
			ended := !sleepUntil(ctx, start.Add(f.Start+f.Duration))
			hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreWait)
			defer cancel()
			if err := h.heal(hctx); err != nil {
				fail(f, "heal", err)
				return
			}
			if ended {
				say("fault %s: %s early (the run ended)", f, h.healed)
			} else {
				say("fault %s: %s", f, h.healed)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// healer is how to heal a fault that fired, and what to say about it.
type healer struct {
	fired, healed string
	heal          func(ctx context.Context) error
}

// fire applies f's fault to its link and returns how to heal it.
func fire(ctx context.Context, f Fault, cl *faultproxy.Client) (healer, error) {
	switch f.Kind {
	case FaultCut:
		if err := cl.Cut(ctx); err != nil {
			return healer{}, err
		}
		return healer{fired: f.Region + " link cut", healed: f.Region + " link healed", heal: cl.Heal}, nil
	default: // FaultDegrade
		st, err := cl.Status(ctx)
		if err != nil {
			return healer{}, err
		}
		before := st.Shape
		worse := faultproxy.Shape{Latency: DegradeLatencyFactor * before.Latency, Jitter: before.Jitter, ResetRate: DegradeResetRate}
		if err := cl.SetShape(ctx, worse); err != nil {
			return healer{}, err
		}
		return healer{
			fired:  fmt.Sprintf("%s link degraded from %s to %s", f.Region, before, worse),
			healed: fmt.Sprintf("%s link restored to %s", f.Region, before),
			heal:   func(ctx context.Context) error { return cl.SetShape(ctx, before) },
		}, nil
	}
}

// sleepUntil waits until t and reports whether it got there before ctx
// ended.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
