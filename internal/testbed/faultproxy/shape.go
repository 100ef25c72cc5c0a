package faultproxy

import (
	"encoding/json"
	"fmt"
	"time"
)

// MaxResetRate is the highest reset rate a link takes, in resets per second.
const MaxResetRate = 1000

// Shape is how a link treats the bytes it carries.
type Shape struct {
	// Latency is the one-way delay of every chunk, in each direction.
	Latency time.Duration
	// Jitter spreads the delay uniformly over Latency±Jitter (never below
	// zero, and never reordering a connection's bytes).
	Jitter time.Duration
	// ResetRate is how many connection resets per second the link makes on
	// average, each on a random live connection.
	ResetRate float64
}

// Validate returns an error that names the field when a value is negative,
// or the reset rate is above MaxResetRate or not a number.
func (s Shape) Validate() error {
	switch {
	case s.Latency < 0:
		return fmt.Errorf("latency %s is negative", s.Latency)
	case s.Jitter < 0:
		return fmt.Errorf("jitter %s is negative", s.Jitter)
	case !(s.ResetRate >= 0): // also NaN
		return fmt.Errorf("reset_rate %v: want resets per second, 0 or more", s.ResetRate)
	case s.ResetRate > MaxResetRate:
		return fmt.Errorf("reset_rate %v is above %d per second", s.ResetRate, MaxResetRate)
	}
	return nil
}

// String formats the shape as "latency 40ms jitter 5ms reset_rate 0.5/s".
func (s Shape) String() string {
	return fmt.Sprintf("latency %s jitter %s reset_rate %g/s", s.Latency, s.Jitter, s.ResetRate)
}

// Status is a link's address, shape and counters, as GET / of the control
// API returns them.
type Status struct {
	Listen string
	Target string
	Shape  Shape
	// Cut is whether the link is down (Cut without Heal).
	Cut bool
	// Conns is the number of live relayed connections; Accepted counts
	// every connection relayed since start, Resets those closed by the reset
	// rate.
	Conns    int
	Accepted int64
	Resets   int64
}

// statusJSON is Status on the wire, with durations as strings ("40ms").
type statusJSON struct {
	Listen    string  `json:"listen"`
	Target    string  `json:"target"`
	Latency   string  `json:"latency"`
	Jitter    string  `json:"jitter"`
	ResetRate float64 `json:"reset_rate"`
	Cut       bool    `json:"cut"`
	Conns     int     `json:"conns"`
	Resets    int64   `json:"resets"`
	Accepted  int64   `json:"accepted"`
}

// MarshalJSON encodes the status with durations as strings: {"listen":
// "127.0.0.1:7401", "latency": "40ms", "reset_rate": 0.5, ...}.
func (s Status) MarshalJSON() ([]byte, error) {
	return json.Marshal(statusJSON{Listen: s.Listen, Target: s.Target, Latency: s.Shape.Latency.String(),
		Jitter: s.Shape.Jitter.String(), ResetRate: s.Shape.ResetRate, Cut: s.Cut, Conns: s.Conns,
		Resets: s.Resets, Accepted: s.Accepted})
}

// UnmarshalJSON decodes what MarshalJSON encodes. It returns an error when
// the JSON or a duration does not parse.
func (s *Status) UnmarshalJSON(b []byte) error {
	var w statusJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	lat, err := time.ParseDuration(w.Latency)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	jit, err := time.ParseDuration(w.Jitter)
	if err != nil {
		return fmt.Errorf("jitter: %w", err)
	}
	*s = Status{Listen: w.Listen, Target: w.Target, Shape: Shape{Latency: lat, Jitter: jit, ResetRate: w.ResetRate},
		Cut: w.Cut, Conns: w.Conns, Resets: w.Resets, Accepted: w.Accepted}
	return nil
}
