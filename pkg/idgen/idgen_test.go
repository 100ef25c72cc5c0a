package idgen

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// testCodes is the region table used throughout the tests.
var testCodes = map[string]uint8{"eu": 1, "us": 2, "ap": 3}

func testRegions(t testing.TB) *Regions {
	t.Helper()
	r, err := NewRegions(testCodes)
	if err != nil {
		t.Fatalf("NewRegions(%v): %v", testCodes, err)
	}
	return r
}

// makeID assembles an ID from its parts, independently of the package code.
func makeID(ticks uint64, seq uint8, code uint8, node uint16) ID {
	return ID(ticks<<24 | uint64(seq)<<16 | uint64(code)<<10 | uint64(node))
}

func TestEpochNeverChanges(t *testing.T) {
	want := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	if !Epoch.Equal(want) {
		t.Fatalf("Epoch = %v, want %v; Epoch must never change", Epoch, want)
	}
}

func TestIDAccessors(t *testing.T) {
	tests := []struct {
		ticks uint64
		seq   uint8
		code  uint8
		node  uint16
	}{
		{0, 0, 1, 0},
		{1, 1, 1, 1},
		{123456789, 200, 2, 512},
		{1<<39 - 1, 255, MaxRegionCode, MaxNode},
		{1<<39 - 1, 0, 1, 0},
		{0, 255, MaxRegionCode, 0},
	}
	for _, tt := range tests {
		id := makeID(tt.ticks, tt.seq, tt.code, tt.node)
		if got := id.RegionCode(); got != tt.code {
			t.Errorf("%#x.RegionCode() = %d, want %d", uint64(id), got, tt.code)
		}
		if got := id.Node(); got != tt.node {
			t.Errorf("%#x.Node() = %d, want %d", uint64(id), got, tt.node)
		}
		if got := id.Sequence(); got != tt.seq {
			t.Errorf("%#x.Sequence() = %d, want %d", uint64(id), got, tt.seq)
		}
		want := Epoch.Add(time.Duration(tt.ticks) * 10 * time.Millisecond)
		if got := id.Time(); !got.Equal(want) {
			t.Errorf("%#x.Time() = %v, want %v", uint64(id), got, want)
		}
	}
}

func TestFormatKnownValues(t *testing.T) {
	r, err := NewRegions(map[string]uint8{"eu": 1, "us": 2, "zz": MaxRegionCode})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id   ID
		want string
	}{
		{makeID(0, 0, 1, 0), "eu-0000000000100"}, // 1<<10 = 32*32
		{makeID(0, 0, 2, 31), "us-000000000020z"},
		{makeID(1, 0, 1, 0), "eu-00000000g0100"}, // 1<<24 = 16*32^4
		{ID(1<<63 - 1), "zz-7zzzzzzzzzzzz"},
	}
	for _, tt := range tests {
		got, err := r.Format(tt.id)
		if err != nil {
			t.Fatalf("Format(%#x): %v", uint64(tt.id), err)
		}
		if got != tt.want {
			t.Errorf("Format(%#x) = %q, want %q", uint64(tt.id), got, tt.want)
		}
		back, err := r.Parse(got)
		if err != nil || back != tt.id {
			t.Errorf("Parse(%q) = %#x, %v; want %#x", got, uint64(back), err, uint64(tt.id))
		}
	}
}

func TestFormatErrors(t *testing.T) {
	r := testRegions(t)
	tests := []struct {
		name string
		id   ID
		want error
	}{
		{"zero", 0, ErrUnknownRegion},
		{"code0", makeID(5, 1, 0, 7), ErrUnknownRegion},
		{"code_not_in_table", makeID(5, 1, 9, 7), ErrUnknownRegion},
		{"bit63_set", makeID(5, 1, 1, 7) | 1<<63, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := r.Format(tt.id)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Format(%#x) = %q, %v; want error wrapping %v", uint64(tt.id), s, err, tt.want)
			}
			if s != "" {
				t.Errorf("Format(%#x) returned %q with an error", uint64(tt.id), s)
			}
			defer func() {
				if recover() == nil {
					t.Errorf("MustFormat(%#x) did not panic", uint64(tt.id))
				}
			}()
			r.MustFormat(tt.id)
		})
	}
}

func TestParse(t *testing.T) {
	r := testRegions(t)
	euID := makeID(987654321, 17, 1, 42)
	eu := r.MustFormat(euID)
	euBody := strings.TrimPrefix(eu, "eu-")
	usID := makeID(55, 0, 2, MaxNode)
	us := r.MustFormat(usID)

	// body with the given character at index i.
	with := func(i int, c string) string { return euBody[:i] + c + euBody[i+1:] }
	zeroCodeBody := encodeForTest(makeID(987654321, 17, 0, 42))
	unknownCodeBody := encodeForTest(makeID(987654321, 17, 9, 42))
	long := "eu-" + strings.Repeat("0", 500)

	tests := []struct {
		name    string
		in      string
		want    ID    // for ok cases
		wantErr error // nil for ok cases
		msg     []string
	}{
		{name: "eu", in: eu, want: euID},
		{name: "us_max_node", in: us, want: usID},
		{name: "min_time", in: "eu-0000000000100", want: makeID(0, 0, 1, 0)},

		{name: "empty", in: "", wantErr: ErrMalformed, msg: []string{`id ""`, "missing '-'"}},
		{name: "missing_dash", in: "eu" + euBody, wantErr: ErrMalformed, msg: []string{"missing '-'"}},
		{name: "only_body", in: euBody, wantErr: ErrMalformed, msg: []string{"missing '-'"}},
		{name: "empty_prefix", in: "-" + euBody, wantErr: ErrMalformed, msg: []string{`prefix ""`}},
		{name: "uppercase_prefix", in: "EU-" + euBody, wantErr: ErrMalformed, msg: []string{`prefix "EU"`}},
		{name: "prefix_too_long", in: "europewest-" + euBody, wantErr: ErrMalformed, msg: []string{"prefix is 10 bytes long"}},
		{name: "empty_body", in: "eu-", wantErr: ErrMalformed, msg: []string{"has 0 bytes, want 13"}},
		{name: "short", in: eu[:len(eu)-1], wantErr: ErrMalformed, msg: []string{"has 12 bytes, want 13"}},
		{name: "long", in: eu + "0", wantErr: ErrMalformed, msg: []string{"has 14 bytes, want 13"}},
		{name: "second_dash", in: "eu-" + euBody[:5] + "-" + euBody[6:], wantErr: ErrMalformed, msg: []string{`'-'`}},
		{name: "double_dash", in: "eu--" + euBody[1:], wantErr: ErrMalformed, msg: []string{`'-' at offset 3`}},
		{name: "uppercase", in: "eu-" + with(12, "A"), wantErr: ErrMalformed, msg: []string{`'A' at offset 15`, "uppercase"}},
		{name: "all_uppercase", in: "eu-" + strings.ToUpper(euBody), wantErr: ErrMalformed, msg: []string{"uppercase"}},
		{name: "letter_i", in: "eu-" + with(4, "i"), wantErr: ErrMalformed, msg: []string{`'i' at offset 7`}},
		{name: "letter_l", in: "eu-" + with(4, "l"), wantErr: ErrMalformed, msg: []string{`'l'`}},
		{name: "letter_o", in: "eu-" + with(4, "o"), wantErr: ErrMalformed, msg: []string{`'o'`}},
		{name: "letter_u", in: "eu-" + with(4, "u"), wantErr: ErrMalformed, msg: []string{`'u'`}},
		{name: "space", in: "eu-" + with(12, " "), wantErr: ErrMalformed},
		{name: "trailing_newline", in: "eu-" + euBody[:12] + "\n", wantErr: ErrMalformed},
		{name: "non_ascii", in: "eu-" + euBody[:11] + "é", wantErr: ErrMalformed, msg: []string{`'é'`}},
		{name: "invalid_utf8", in: "eu-" + euBody[:12] + "\xff", wantErr: ErrMalformed, msg: []string{"0xff"}},
		{name: "overflow_8", in: "eu-" + with(0, "8"), wantErr: ErrMalformed, msg: []string{"overflows 63 bits", `'8'`}},
		{name: "overflow_z", in: "eu-zzzzzzzzzzzzz", wantErr: ErrMalformed, msg: []string{"overflows 63 bits"}},
		{name: "zero_value", in: "eu-0000000000000", wantErr: ErrMalformed, msg: []string{"region code 0"}},
		{name: "zero_region_code", in: "eu-" + zeroCodeBody, wantErr: ErrMalformed, msg: []string{"region code 0"}},
		{name: "truncated_message", in: long, wantErr: ErrMalformed, msg: []string{"truncated, 503 bytes"}},

		{name: "unknown_prefix", in: "zz-" + euBody, wantErr: ErrUnknownRegion, msg: []string{`"zz"`, `region code 1 ("eu")`}},
		{name: "unknown_prefix_unknown_bits", in: "zz-" + unknownCodeBody, wantErr: ErrUnknownRegion, msg: []string{`"zz"`}},

		{name: "eu_relabelled_us", in: "us-" + euBody, wantErr: ErrRegionMismatch,
			msg: []string{`id "us-` + euBody + `"`, `prefix says region "us" but its bits say region code 1 ("eu")`}},
		{name: "us_relabelled_ap", in: "ap-" + strings.TrimPrefix(us, "us-"), wantErr: ErrRegionMismatch,
			msg: []string{`prefix says region "ap" but its bits say region code 2 ("us")`}},
		{name: "bits_code_not_in_table", in: "eu-" + unknownCodeBody, wantErr: ErrRegionMismatch,
			msg: []string{`region code 9`, "not in the region table"}},
	}
	for _, tt := range tests {
		outcome := "ok"
		switch tt.wantErr {
		case ErrMalformed:
			outcome = "malformed"
		case ErrUnknownRegion:
			outcome = "unknown_region"
		case ErrRegionMismatch:
			outcome = "region_mismatch"
		}
		t.Run(outcome+"/"+tt.name, func(t *testing.T) {
			got, err := r.Parse(tt.in)
			home, herr := r.HomeRegion(tt.in)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Parse(%q): unexpected error %v", tt.in, err)
				}
				if got != tt.want {
					t.Fatalf("Parse(%q) = %#x, want %#x", tt.in, uint64(got), uint64(tt.want))
				}
				if back := r.MustFormat(got); back != tt.in {
					t.Errorf("Format(Parse(%q)) = %q", tt.in, back)
				}
				wantHome, _, _ := strings.Cut(tt.in, "-")
				if herr != nil || home != wantHome {
					t.Errorf("HomeRegion(%q) = %q, %v; want %q", tt.in, home, herr, wantHome)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Parse(%q) error = %v; want errors.Is %v", tt.in, err, tt.wantErr)
			}
			for _, other := range []error{ErrMalformed, ErrUnknownRegion, ErrRegionMismatch} {
				if other != tt.wantErr && errors.Is(err, other) {
					t.Errorf("Parse(%q) error %v also matches %v", tt.in, err, other)
				}
			}
			if got != 0 {
				t.Errorf("Parse(%q) returned id %#x with an error", tt.in, uint64(got))
			}
			msg := err.Error()
			if len(tt.in) <= 64 && !strings.Contains(msg, fmt.Sprintf("%q", tt.in)) {
				t.Errorf("error %q does not quote the input", msg)
			}
			if len(msg) > 400 {
				t.Errorf("error message is %d bytes long: %q", len(msg), msg)
			}
			for _, m := range tt.msg {
				if !strings.Contains(msg, m) {
					t.Errorf("error %q does not contain %q", msg, m)
				}
			}
			if !errors.Is(herr, tt.wantErr) || home != "" {
				t.Errorf("HomeRegion(%q) = %q, %v; want error wrapping %v", tt.in, home, herr, tt.wantErr)
			}
		})
	}
}

// encodeForTest is an independent base32 encoder (body only), so that the
// tests do not only check Format against itself.
func encodeForTest(id ID) string {
	const a = "0123456789abcdefghjkmnpqrstvwxyz"
	var b strings.Builder
	for shift := 60; shift >= 0; shift -= 5 {
		b.WriteByte(a[(uint64(id)>>shift)&31])
	}
	return b.String()
}

func TestFormatMatchesIndependentEncoder(t *testing.T) {
	r := testRegions(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		code := uint8(1 + rng.IntN(3))
		id := ID(rng.Uint64()>>1)&^(MaxRegionCode<<10) | ID(code)<<10
		name := []string{"", "eu", "us", "ap"}[code]
		want := name + "-" + encodeForTest(id)
		if got := r.MustFormat(id); got != want {
			t.Fatalf("Format(%#x) = %q, want %q", uint64(id), got, want)
		}
	}
}

func TestRoundTripGenerated(t *testing.T) {
	r := testRegions(t)
	nodes := []uint16{0, 1, 7, 512, MaxNode}
	for _, region := range []string{"eu", "us", "ap"} {
		for _, node := range nodes {
			g, err := NewGenerator(r, region, node)
			if err != nil {
				t.Fatalf("NewGenerator(%q, %d): %v", region, node, err)
			}
			if g.Region() != region {
				t.Errorf("Region() = %q, want %q", g.Region(), region)
			}
			code, _ := r.Code(region)
			start := time.Now()
			for range 300 {
				s, err := g.NextString()
				if err != nil {
					t.Fatalf("NextString: %v", err)
				}
				if !strings.HasPrefix(s, region+"-") || len(s) != len(region)+1+13 {
					t.Fatalf("NextString() = %q, want %q prefix and 13-char body", s, region+"-")
				}
				id, err := r.Parse(s)
				if err != nil {
					t.Fatalf("Parse(%q): %v", s, err)
				}
				if back := r.MustFormat(id); back != s {
					t.Fatalf("Format(Parse(%q)) = %q", s, back)
				}
				if id.RegionCode() != code || id.Node() != node {
					t.Fatalf("%q: RegionCode, Node = %d, %d; want %d, %d", s, id.RegionCode(), id.Node(), code, node)
				}
				if home, err := r.HomeRegion(s); err != nil || home != region {
					t.Fatalf("HomeRegion(%q) = %q, %v; want %q", s, home, err, region)
				}
				now := time.Now()
				if tm := id.Time(); tm.Before(start.Add(-10*time.Millisecond)) || tm.After(now.Add(10*time.Millisecond)) {
					t.Fatalf("%q: Time() = %v, want between %v and %v", s, tm, start, now)
				}
			}
		}
	}
}

func TestLexicalOrderIsNumericOrder(t *testing.T) {
	r := testRegions(t)
	g, err := NewGenerator(r, "us", 3)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	ids := make([]ID, n)
	strs := make([]string, n)
	for i := range n {
		if ids[i], err = g.Next(); err != nil {
			t.Fatal(err)
		}
		strs[i] = r.MustFormat(ids[i])
	}
	for i := 1; i < n; i++ {
		if !(ids[i-1] < ids[i]) || !(strs[i-1] < strs[i]) {
			t.Fatalf("order broken at %d: %#x %q then %#x %q", i, uint64(ids[i-1]), strs[i-1], uint64(ids[i]), strs[i])
		}
	}
	shuffled := slices.Clone(strs)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	slices.Sort(shuffled)
	if !slices.Equal(shuffled, strs) {
		t.Fatal("sorting the text forms does not reproduce numeric order")
	}

	// Arbitrary 63-bit values in one region, including ones far apart.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		a := ID(rng.Uint64()>>1)&^(MaxRegionCode<<10) | 2<<10
		b := ID(rng.Uint64()>>(1+rng.IntN(63)))&^(MaxRegionCode<<10) | 2<<10
		sa, sb := r.MustFormat(a), r.MustFormat(b)
		if (a < b) != (sa < sb) || (a == b) != (sa == sb) {
			t.Fatalf("order mismatch: %#x %q vs %#x %q", uint64(a), sa, uint64(b), sb)
		}
	}
}

func TestMonotonic(t *testing.T) {
	r := testRegions(t)
	g, err := NewGenerator(r, "eu", 0)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := g.Next()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		id, err := g.Next()
		if err != nil {
			t.Fatal(err)
		}
		if id <= prev {
			t.Fatalf("id %d = %#x not greater than previous %#x", i, uint64(id), uint64(prev))
		}
		prev = id
	}
}

func TestConcurrentUnique(t *testing.T) {
	r := testRegions(t)
	regions := []string{"eu", "us", "ap"}
	const (
		nodesPerRegion = 4
		goroutines     = 16
		perGoroutine   = 2000
	)
	var gens []*Generator
	for _, region := range regions {
		for node := range uint16(nodesPerRegion) {
			g, err := NewGenerator(r, region, node*100)
			if err != nil {
				t.Fatal(err)
			}
			gens = append(gens, g)
		}
	}

	results := make([][]ID, goroutines)
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for w := range goroutines {
		wg.Go(func() {
			g := gens[w%len(gens)]
			out := make([]ID, 0, perGoroutine)
			for range perGoroutine {
				id, err := g.Next()
				if err != nil {
					errs[w] = err
					return
				}
				out = append(out, id)
			}
			results[w] = out
		})
	}
	wg.Wait()

	seen := make(map[ID]int, goroutines*perGoroutine)
	for w, ids := range results {
		if errs[w] != nil {
			t.Fatalf("goroutine %d: %v", w, errs[w])
		}
		if len(ids) != perGoroutine {
			t.Fatalf("goroutine %d: got %d ids, want %d", w, len(ids), perGoroutine)
		}
		g := gens[w%len(gens)]
		code, _ := r.Code(g.Region())
		for i, id := range ids {
			if i > 0 && id <= ids[i-1] {
				t.Fatalf("goroutine %d: id %d = %#x not greater than previous %#x", w, i, uint64(id), uint64(ids[i-1]))
			}
			if id.RegionCode() != code {
				t.Fatalf("goroutine %d: id %#x has region code %d, want %d", w, uint64(id), id.RegionCode(), code)
			}
			if prev, dup := seen[id]; dup {
				t.Fatalf("duplicate id %#x from goroutines %d and %d", uint64(id), prev, w)
			}
			seen[id] = w
		}
	}
	if len(seen) != goroutines*perGoroutine {
		t.Fatalf("got %d unique ids, want %d", len(seen), goroutines*perGoroutine)
	}
}

func TestNewRegionsErrors(t *testing.T) {
	tests := []struct {
		name  string
		codes map[string]uint8
		msg   string
	}{
		{"nil", nil, "no regions"},
		{"empty", map[string]uint8{}, "no regions"},
		{"name_too_short", map[string]uint8{"e": 1}, `"e"`},
		{"name_too_long", map[string]uint8{"europewest": 1}, `"europewest"`},
		{"name_uppercase", map[string]uint8{"EU": 1}, `"EU"`},
		{"name_digit", map[string]uint8{"eu1": 1}, `"eu1"`},
		{"name_dash", map[string]uint8{"eu-w": 1}, `"eu-w"`},
		{"name_empty", map[string]uint8{"": 1}, `""`},
		{"code_zero", map[string]uint8{"eu": 0}, "code 0"},
		{"code_64", map[string]uint8{"eu": 64}, "code 64"},
		{"code_255", map[string]uint8{"eu": 255}, "code 255"},
		{"duplicate_code", map[string]uint8{"eu": 1, "us": 1}, `code 1 already used by region "eu"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRegions(tt.codes)
			if err == nil {
				t.Fatalf("NewRegions(%v) succeeded, want error", tt.codes)
			}
			if r != nil {
				t.Errorf("NewRegions(%v) returned non-nil Regions with an error", tt.codes)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
		})
	}
}

func TestNewRegionsCopiesAndCode(t *testing.T) {
	codes := map[string]uint8{"eu": 1, "us": 2, "zz": MaxRegionCode}
	r, err := NewRegions(codes)
	if err != nil {
		t.Fatal(err)
	}
	codes["xx"] = 9
	delete(codes, "eu")
	if c, ok := r.Code("eu"); !ok || c != 1 {
		t.Errorf(`Code("eu") = %d, %v; want 1, true`, c, ok)
	}
	if c, ok := r.Code("zz"); !ok || c != MaxRegionCode {
		t.Errorf(`Code("zz") = %d, %v; want %d, true`, c, ok, MaxRegionCode)
	}
	for _, name := range []string{"xx", "", "EU"} {
		if c, ok := r.Code(name); ok || c != 0 {
			t.Errorf("Code(%q) = %d, %v; want 0, false", name, c, ok)
		}
	}
}

func TestNewGeneratorErrors(t *testing.T) {
	r := testRegions(t)
	tests := []struct {
		name    string
		regions *Regions
		region  string
		node    uint16
		is      error
	}{
		{"nil_regions", nil, "eu", 0, ErrUnknownRegion},
		{"unknown_region", r, "zz", 0, ErrUnknownRegion},
		{"empty_region", r, "", 0, ErrUnknownRegion},
		{"node_1024", r, "eu", MaxNode + 1, nil},
		{"node_max_uint16", r, "eu", 65535, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGenerator(tt.regions, tt.region, tt.node)
			if err == nil {
				t.Fatalf("NewGenerator(%q, %d) succeeded, want error", tt.region, tt.node)
			}
			if g != nil {
				t.Errorf("NewGenerator returned a Generator with an error")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v does not wrap %v", err, tt.is)
			}
		})
	}
	if _, err := NewGenerator(r, "ap", MaxNode); err != nil {
		t.Errorf("NewGenerator(ap, MaxNode): %v", err)
	}

	var zero Generator
	if _, err := zero.Next(); err == nil {
		t.Error("zero Generator: Next succeeded, want error")
	}
	if _, err := zero.NextString(); err == nil {
		t.Error("zero Generator: NextString succeeded, want error")
	}
}

func FuzzParse(f *testing.F) {
	r, err := NewRegions(testCodes)
	if err != nil {
		f.Fatal(err)
	}
	for _, code := range []uint8{1, 2, 3} {
		g, err := NewGenerator(r, []string{"", "eu", "us", "ap"}[code], uint16(code)*100)
		if err != nil {
			f.Fatal(err)
		}
		for range 3 {
			s, err := g.NextString()
			if err != nil {
				f.Fatal(err)
			}
			f.Add(s)
		}
	}
	for _, s := range []string{
		"", "-", "eu-", "eu", "eu-0000000000100", "eu-0000000000000", "ap-7zzzzzzzzzzzz",
		"eu-7zzzzzzzzzzzz", "us-8000000000000", "EU-0000000000100", "eu-000000000010O",
		"us-0000000000100", "zz-0000000000100", "eu--000000000100", "eu-0000000000100\x00",
		"eu-ililililililu", "é-0000000000100", "eu-\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
		strings.Repeat("a", 200),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := r.Parse(s)
		if err != nil {
			if id != 0 {
				t.Fatalf("Parse(%q) returned id %#x with error %v", s, uint64(id), err)
			}
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnknownRegion) && !errors.Is(err, ErrRegionMismatch) {
				t.Fatalf("Parse(%q) error %v wraps no sentinel", s, err)
			}
			if len(err.Error()) > 600 {
				t.Fatalf("Parse(%q) error is %d bytes long", s, len(err.Error()))
			}
			return
		}
		back, err := r.Format(id)
		if err != nil {
			t.Fatalf("Format(Parse(%q)) error: %v", s, err)
		}
		if back != s {
			t.Fatalf("Format(Parse(%q)) = %q, not canonical", s, back)
		}
		prefix, _, _ := strings.Cut(s, "-")
		code, ok := r.Code(prefix)
		if !ok || code != id.RegionCode() || code == 0 {
			t.Fatalf("Parse(%q): prefix %q (code %d, %v) disagrees with RegionCode %d", s, prefix, code, ok, id.RegionCode())
		}
		if home, err := r.HomeRegion(s); err != nil || home != prefix {
			t.Fatalf("HomeRegion(%q) = %q, %v; want %q", s, home, err, prefix)
		}
	})
}
