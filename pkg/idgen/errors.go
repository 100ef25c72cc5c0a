package idgen

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel errors. Every error returned by Parse, HomeRegion, Format and
// NewGenerator that concerns an ID or a region wraps exactly one of these, so
// callers can branch with errors.Is.
var (
	// ErrMalformed reports text that is not a syntactically valid ID: no
	// '-', a prefix that is not a region name, a body of the wrong length,
	// characters outside the lowercase Crockford base32 alphabet, a value
	// wider than 63 bits, or the reserved region code 0 in the bits. Format
	// also returns it for an ID value wider than 63 bits.
	ErrMalformed = errors.New("malformed id")

	// ErrUnknownRegion reports a region name or region code that is not in
	// the Regions table.
	ErrUnknownRegion = errors.New("unknown region")

	// ErrRegionMismatch reports a well-formed ID whose text prefix names a
	// different region from the region code embedded in its bits, for
	// example an eu ID relabelled "us-…".
	ErrRegionMismatch = errors.New("region prefix does not match id bits")

	// ErrClockBehind reports a Generator whose clock is not past the
	// high-water time of its machine id (GeneratorConfig.Floor): minting
	// then could repeat an ID minted before.
	ErrClockBehind = errors.New("clock behind the node's high-water time")
)

// maxQuoted is the longest input quoted verbatim in an error message.
const maxQuoted = 64

// quote returns s as a Go-quoted string for an error message, truncated to
// maxQuoted bytes so that hostile input cannot blow up logs.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s...(truncated, %d bytes)", strconv.Quote(s[:maxQuoted]), len(s))
}

// parseError builds the error for input s: `idgen: id "s": <detail>: <sentinel>`.
func parseError(s string, sentinel error, format string, args ...any) error {
	return fmt.Errorf("idgen: id %s: %s: %w", quote(s), fmt.Sprintf(format, args...), sentinel)
}
