// Package idgen mints and parses region-prefixed sonyflake IDs, the IDs of
// every paymesh account and transfer.
//
// # Bit layout
//
// An ID is a 63-bit sonyflake value; bit 63 of the uint64 is always 0.
//
//	bit  63   62 ........... 24   23 .... 16   15 ..... 10   9 ...... 0
//	     [0]  [elapsed time   ]   [sequence]   [region code] [node     ]
//	          39 bits, 10 ms      8 bits       6 bits         10 bits
//	          units since Epoch                \_____ sonyflake machine id _____/
//
// The 16-bit sonyflake machine id is split into a region code (high 6 bits,
// 1..MaxRegionCode; 0 is reserved so that the zero ID never parses) and a node
// id (low 10 bits, 0..MaxNode).
//
// # Text form
//
// The text form is "<region>-<body>", for example "eu-0a1b2c3d4e5f6". The
// region is the region's name (2-8 lowercase letters) and the body is the
// 63-bit value in lowercase Crockford base32 (alphabet
// "0123456789abcdefghjkmnpqrstvwxyz"), exactly 13 characters, zero-padded,
// most significant digit first. Because the width is fixed and the alphabet is
// in ASCII order, the lexical order of bodies equals the numeric order of IDs.
// Parsing is strict: there is exactly one accepted text for each ID
// (uppercase and the Crockford aliases i, l, o, u are rejected), and the
// prefix must agree with the region code in the bits.
//
// # Why
//
//   - Home region without a lookup: the region is in the bits and, for
//     humans and routers, in the prefix, so any service can route a request
//     for an ID to its home region from the ID alone (see Regions.HomeRegion).
//   - No collisions across regions or nodes: every (region, node) pair has a
//     distinct sonyflake machine id, and sonyflake IDs from different machine
//     ids never collide, provided at most one Generator runs for each
//     (region, node) at a time: the services lease their node id
//     (platform/nodelease) and mint under GeneratorConfig.Permit.
//   - Monotonic per node: a Generator's successive IDs strictly increase,
//     because sonyflake keeps an in-memory high-water time and sequence; if
//     the wall clock steps back it keeps counting from the high-water mark
//     instead of reusing earlier values. Two caveats follow from that: after
//     a backwards clock step, a Generator that exhausts its 256 sequence
//     numbers blocks in Next until the wall clock catches up; and the
//     high-water mark lives in memory. A Generator made with a Floor (the
//     high-water time a node lease persisted for its machine id, see
//     GeneratorConfig) never mints at or below it, so a process restarted
//     while its clock is behind the last ID minted for its node refuses to
//     mint instead of reissuing IDs.
package idgen

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sony/sonyflake"
)

// ID is a raw 63-bit sonyflake value. Its zero value is not a valid ID: it
// has region code 0, which Parse rejects and Format does not know.
type ID uint64

// Bit widths and shifts of the ID layout.
const (
	nodeBits     = 10
	regionBits   = 6
	machineBits  = regionBits + nodeBits // 16, sonyflake.BitLenMachineID
	sequenceBits = 8                     // sonyflake.BitLenSequence
	timeBits     = 39                    // sonyflake.BitLenTime
	timeShift    = machineBits + sequenceBits
	valueBits    = timeBits + sequenceBits + machineBits // 63
	timeUnit     = 10 * time.Millisecond                 // sonyflake tick
)

// Compile-time checks that the layout matches the sonyflake package.
var (
	_ [machineBits - sonyflake.BitLenMachineID]struct{}
	_ [sonyflake.BitLenMachineID - machineBits]struct{}
	_ [sequenceBits - sonyflake.BitLenSequence]struct{}
	_ [sonyflake.BitLenSequence - sequenceBits]struct{}
	_ [timeBits - sonyflake.BitLenTime]struct{}
	_ [sonyflake.BitLenTime - timeBits]struct{}
	_ [MaxRegionCode - (1<<regionBits - 1)]struct{}
	_ [(1<<regionBits - 1) - MaxRegionCode]struct{}
	_ [MaxNode - (1<<nodeBits - 1)]struct{}
	_ [(1<<nodeBits - 1) - MaxNode]struct{}
)

// MaxRegionCode is the largest region code that fits the 6 region bits. Valid
// codes are 1..MaxRegionCode; 0 is reserved.
const MaxRegionCode = 63 // 1<<regionBits - 1

// MaxNode is the largest node id that fits the 10 node bits. Valid node ids
// are 0..MaxNode.
const MaxNode = 1023 // 1<<nodeBits - 1

// Epoch is the sonyflake start time: an ID's time bits count 10 ms ticks since
// Epoch. It is a variable only because Go has no time constants; it MUST NEVER
// CHANGE, or every existing ID would decode to a different time and newly
// minted IDs could collide with, or sort before, existing ones.
var Epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// RegionCode returns the region code in the high 6 bits of the ID's machine
// id. It never fails; it returns 0 for IDs that were not validly minted.
func (id ID) RegionCode() uint8 {
	return uint8(id>>nodeBits) & MaxRegionCode
}

// Node returns the node id in the low 10 bits of the ID's machine id. It never
// fails.
func (id ID) Node() uint16 {
	return uint16(id) & MaxNode
}

// Sequence returns the ID's 8-bit sonyflake sequence number. It never fails.
func (id ID) Sequence() uint8 {
	return uint8(id >> machineBits)
}

// Time returns the time the ID was minted, in UTC, truncated to sonyflake's
// 10 ms resolution (Epoch plus the elapsed ticks in the ID). It never fails;
// the time bits of an ID wider than 63 bits are read as if bit 63 were clear.
func (id ID) Time() time.Time {
	ticks := (uint64(id) >> timeShift) & (1<<timeBits - 1)
	return Epoch.Add(time.Duration(ticks) * timeUnit)
}

// valid63 reports whether the ID fits in 63 bits.
func (id ID) valid63() bool { return uint64(id)>>valueBits == 0 }

// Text encoding.
const (
	alphabet = "0123456789abcdefghjkmnpqrstvwxyz" // lowercase Crockford base32
	bodyLen  = 13                                 // ceil(63/5)
	// maxFirst is the largest first body character: 13*5 = 65 bits, of
	// which the top two must be zero for a 63-bit value.
	maxFirst = '7'
)

// decodeTable maps a byte to its base32 digit value, or 0xff if the byte is
// not in the alphabet.
var decodeTable = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i := 0; i < len(alphabet); i++ {
		t[alphabet[i]] = byte(i)
	}
	return t
}()

var nameRE = regexp.MustCompile(`^[a-z]{2,8}$`)

// Regions maps region names to region codes and back. Build it once from the
// region table with NewRegions; it is immutable and safe for concurrent use.
type Regions struct {
	byName map[string]uint8
	byCode [MaxRegionCode + 1]string // "" = unknown; index 0 always ""
}

// NewRegions returns a Regions built from a name-to-code map such as
// deploy/regions.Table.Codes(). It returns an error, and a nil *Regions, if
// the map is empty, a name does not match ^[a-z]{2,8}$, a code is 0 or greater
// than MaxRegionCode, or two names share a code. The map is copied.
func NewRegions(codes map[string]uint8) (*Regions, error) {
	if len(codes) == 0 {
		return nil, errors.New("idgen: no regions given")
	}
	// Check in name order so that errors are deterministic.
	names := make([]string, 0, len(codes))
	for name := range codes {
		names = append(names, name)
	}
	slices.Sort(names)

	r := &Regions{byName: make(map[string]uint8, len(codes))}
	for _, name := range names {
		code := codes[name]
		if !nameRE.MatchString(name) {
			return nil, fmt.Errorf("idgen: region name %s: want 2-8 lowercase letters", quote(name))
		}
		if code == 0 || code > MaxRegionCode {
			return nil, fmt.Errorf("idgen: region %q: code %d outside 1..%d", name, code, MaxRegionCode)
		}
		if other := r.byCode[code]; other != "" {
			return nil, fmt.Errorf("idgen: region %q: code %d already used by region %q", name, code, other)
		}
		r.byCode[code] = name
		r.byName[name] = code
	}
	return r, nil
}

// Names returns the region names in code order.
func (r *Regions) Names() []string {
	var out []string
	for _, n := range r.byCode {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// Code returns the code of the named region, or 0 and false if the name is not
// in the table.
func (r *Regions) Code(name string) (uint8, bool) {
	code, ok := r.byName[name]
	return code, ok
}

// name returns the region name for code, or "" if unknown.
func (r *Regions) name(code uint8) string {
	if int(code) >= len(r.byCode) {
		return ""
	}
	return r.byCode[code]
}

// Format returns the canonical text form "<region>-<13 base32 chars>" of id.
// It returns an error wrapping ErrUnknownRegion if the ID's region code is not
// in the table (including the reserved code 0), or ErrMalformed if the value
// does not fit in 63 bits.
func (r *Regions) Format(id ID) (string, error) {
	if !id.valid63() {
		return "", fmt.Errorf("idgen: format id %d: value does not fit in 63 bits: %w", uint64(id), ErrMalformed)
	}
	name := r.name(id.RegionCode())
	if name == "" {
		return "", fmt.Errorf("idgen: format id %d: region code %d is not in the region table: %w",
			uint64(id), id.RegionCode(), ErrUnknownRegion)
	}
	var buf [8 + 1 + bodyLen]byte
	n := copy(buf[:], name)
	buf[n] = '-'
	body := buf[n+1 : n+1+bodyLen]
	v := uint64(id)
	for i := bodyLen - 1; i >= 0; i-- {
		body[i] = alphabet[v&31]
		v >>= 5
	}
	return string(buf[:n+1+bodyLen]), nil
}

// MustFormat is like Format but panics instead of returning an error. Use it
// only for IDs this process minted with a Generator built on the same Regions,
// whose region code is known by construction.
func (r *Regions) MustFormat(id ID) string {
	s, err := r.Format(id)
	if err != nil {
		panic(err)
	}
	return s
}

// Parse returns the ID written in s, which must be exactly the canonical form
// produced by Format. On failure it returns 0 and an error that quotes s
// (truncated past 64 bytes), says what is wrong, and wraps:
//   - ErrMalformed: no '-', a prefix that is not 2-8 lowercase letters, a
//     body that is not 13 characters, a character outside the lowercase
//     Crockford base32 alphabet (uppercase and i, l, o, u are rejected), a
//     first body character above '7' (more than 63 bits), or the reserved
//     region code 0 in the bits;
//   - ErrUnknownRegion: a well-formed prefix that is not in the table;
//   - ErrRegionMismatch: a prefix naming a different region than the region
//     code in the bits (or bits whose region code is not in the table).
func (r *Regions) Parse(s string) (ID, error) {
	prefix, body, ok := cutDash(s)
	if !ok {
		return 0, parseError(s, ErrMalformed, "missing '-' between region and value")
	}
	if !nameRE.MatchString(prefix) {
		if len(prefix) > 8 {
			// Don't quote it again: the whole input is already quoted.
			return 0, parseError(s, ErrMalformed, "region prefix is %d bytes long, not a region name (want 2-8 lowercase letters)", len(prefix))
		}
		return 0, parseError(s, ErrMalformed, "region prefix %q is not a region name (want 2-8 lowercase letters)", prefix)
	}
	if len(body) != bodyLen {
		return 0, parseError(s, ErrMalformed, "value after %q has %d bytes, want %d", prefix+"-", len(body), bodyLen)
	}
	var v uint64
	for i := 0; i < bodyLen; i++ {
		c := body[i]
		d := decodeTable[c]
		if d == 0xff {
			return 0, parseError(s, ErrMalformed, "%s", badChar(body, i, len(prefix)+1+i))
		}
		v = v<<5 | uint64(d)
	}
	if body[0] > maxFirst {
		return 0, parseError(s, ErrMalformed, "value overflows 63 bits (first character %q must be 0-7)", body[0])
	}
	id := ID(v)
	code := id.RegionCode()
	if code == 0 {
		return 0, parseError(s, ErrMalformed, "its bits carry the reserved region code 0")
	}
	prefixCode, known := r.byName[prefix]
	if !known {
		if bitsName := r.name(code); bitsName != "" {
			return 0, parseError(s, ErrUnknownRegion, "unknown region prefix %q (its bits say region code %d (%q))", prefix, code, bitsName)
		}
		return 0, parseError(s, ErrUnknownRegion, "unknown region prefix %q", prefix)
	}
	if prefixCode != code {
		if bitsName := r.name(code); bitsName != "" {
			return 0, parseError(s, ErrRegionMismatch, "prefix says region %q but its bits say region code %d (%q)", prefix, code, bitsName)
		}
		return 0, parseError(s, ErrRegionMismatch, "prefix says region %q (code %d) but its bits say region code %d, which is not in the region table", prefix, prefixCode, code)
	}
	return id, nil
}

// HomeRegion returns the name of the region that minted the ID written in s.
// It does no I/O: it is Parse followed by a table lookup, and on failure it
// returns "" and the error from Parse.
func (r *Regions) HomeRegion(s string) (string, error) {
	id, err := r.Parse(s)
	if err != nil {
		return "", err
	}
	return r.name(id.RegionCode()), nil
}

// cutDash splits s at its first '-'. Region names contain no '-', so any
// further '-' lands in the body and is rejected there.
func cutDash(s string) (prefix, body string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '-' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// badChar describes the invalid byte body[i], which is at offset off in the
// whole input.
func badChar(body string, i, off int) string {
	c := body[i]
	switch {
	case c >= utf8.RuneSelf:
		ru, _ := utf8.DecodeRuneInString(body[i:])
		if ru == utf8.RuneError {
			return fmt.Sprintf("byte %#02x at offset %d is not in the lowercase Crockford base32 alphabet", c, off)
		}
		return fmt.Sprintf("character %q at offset %d is not in the lowercase Crockford base32 alphabet", ru, off)
	case c >= 'A' && c <= 'Z':
		return fmt.Sprintf("character %q at offset %d is uppercase; only lowercase Crockford base32 is accepted", rune(c), off)
	case c == 'i' || c == 'l' || c == 'o' || c == 'u':
		return fmt.Sprintf("character %q at offset %d is not in the Crockford base32 alphabet (i, l, o and u are excluded)", rune(c), off)
	default:
		return fmt.Sprintf("character %q at offset %d is not in the lowercase Crockford base32 alphabet", rune(c), off)
	}
}

// Generator mints IDs for one (region, node). It is safe for concurrent use.
// At most one Generator may exist for a given (region, node) across the whole
// deployment at any time, or IDs will collide: a node lease
// (GeneratorConfig.Permit) is how a deployment makes sure of it.
type Generator struct {
	sf      *sonyflake.Sonyflake
	regions *Regions
	region  string
	node    uint16
	// floorTicks: every ID minted has more time ticks than this.
	floorTicks uint64
	permit     func() error
	last       atomic.Uint64 // the greatest ID minted, 0 if none
}

// GeneratorConfig holds what a Generator takes from the process that runs
// it, beyond its machine id. The zero value is a Generator trusted to be
// alone on its machine id with a clock that never went back.
type GeneratorConfig struct {
	// Floor is the high-water time of the machine id: the time of the last
	// ID any earlier Generator may have minted for it (persisted by a node
	// lease). Next returns an error wrapping ErrClockBehind rather than mint
	// an ID whose time is not after Floor's 10 ms tick. Zero: no floor.
	Floor time.Time
	// Permit, if set, is asked before each ID; a non-nil error (a lost
	// node lease, say) stops minting and Next returns it wrapped. It must
	// be cheap: it runs on every ID.
	Permit func() error
}

// NewGenerator returns a Generator for the named region and node id, with
// no floor and no permit (see NewGeneratorWith). It returns an error
// wrapping ErrUnknownRegion if regions is nil or region is not in it, and an
// error if node is greater than MaxNode or sonyflake cannot be set up (for
// example if Epoch is in the future).
func NewGenerator(r *Regions, region string, node uint16) (*Generator, error) {
	return NewGeneratorWith(r, region, node, GeneratorConfig{})
}

// NewGeneratorWith returns a Generator for the named region and node id
// that mints only after gc.Floor and while gc.Permit allows. It returns the
// errors of NewGenerator.
func NewGeneratorWith(r *Regions, region string, node uint16, gc GeneratorConfig) (*Generator, error) {
	if r == nil {
		return nil, fmt.Errorf("idgen: new generator for region %q: nil Regions: %w", region, ErrUnknownRegion)
	}
	code, ok := r.Code(region)
	if !ok {
		return nil, fmt.Errorf("idgen: new generator: region %s is not in the region table: %w", quote(region), ErrUnknownRegion)
	}
	if node > MaxNode {
		return nil, fmt.Errorf("idgen: new generator for region %q: node %d outside 0..%d", region, node, MaxNode)
	}
	machineID := uint16(code)<<nodeBits | node
	sf, err := sonyflake.New(sonyflake.Settings{
		StartTime: Epoch,
		MachineID: func() (uint16, error) { return machineID, nil },
	})
	if err != nil {
		return nil, fmt.Errorf("idgen: new generator for region %q node %d: %w", region, node, err)
	}
	g := &Generator{sf: sf, regions: r, region: region, node: node, permit: gc.Permit}
	if gc.Floor.After(Epoch) {
		g.floorTicks = uint64(gc.Floor.Sub(Epoch) / timeUnit)
	}
	return g, nil
}

// Next returns a new ID, strictly greater than every ID this Generator
// returned before. It may sleep up to 10 ms when 256 IDs were already minted
// in the current tick. It returns 0 and an error if the Generator was not
// made by NewGenerator, its Permit refuses, the clock is not past its Floor
// (wrapping ErrClockBehind), or sonyflake fails (its 39-bit time, about 174
// years after Epoch, has run out).
func (g *Generator) Next() (ID, error) {
	if g == nil || g.sf == nil {
		return 0, errors.New("idgen: Generator not created by NewGenerator")
	}
	if g.permit != nil {
		if err := g.permit(); err != nil {
			return 0, fmt.Errorf("idgen: next id for region %q node %d: %w", g.region, g.node, err)
		}
	}
	v, err := g.sf.NextID()
	if err != nil {
		return 0, fmt.Errorf("idgen: next id for region %q node %d: %w", g.region, g.node, err)
	}
	if ticks := v >> timeShift; ticks <= g.floorTicks {
		return 0, fmt.Errorf("idgen: next id for region %q node %d: clock at %s, not after the node's high-water time %s: %w",
			g.region, g.node, ID(v).Time().Format(time.RFC3339Nano), Epoch.Add(time.Duration(g.floorTicks)*timeUnit).Format(time.RFC3339Nano), ErrClockBehind)
	}
	for {
		last := g.last.Load()
		if v <= last || g.last.CompareAndSwap(last, v) {
			break
		}
	}
	return ID(v), nil
}

// HighWater returns the time of the greatest ID this Generator minted (its
// 10 ms tick), or the zero time if it minted none. A node lease persists it.
func (g *Generator) HighWater() time.Time {
	v := g.last.Load()
	if v == 0 {
		return time.Time{}
	}
	return ID(v).Time()
}

// NextString returns a new ID in text form, as Next followed by Format. It
// returns "" and the error from Next on failure.
func (g *Generator) NextString() (string, error) {
	id, err := g.Next()
	if err != nil {
		return "", err
	}
	return g.regions.Format(id)
}

// Region returns the name of the region this Generator mints IDs for. It
// never fails.
func (g *Generator) Region() string {
	return g.region
}
