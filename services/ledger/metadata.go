package ledger

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Limits of a client's metadata and reference on a transfer or an account.
// Exceeding one is an invalid request whose message names the limit.
const (
	// MaxMetadataKeys is how many keys metadata may have.
	MaxMetadataKeys = 20
	// MaxMetadataKeyLen is the longest key, in characters of
	// [A-Za-z0-9_.:-] (a key is written in a query as metadata[key]).
	MaxMetadataKeyLen = 40
	// MaxMetadataValueBytes is the longest value, in bytes of UTF-8
	// without control characters.
	MaxMetadataValueBytes = 500
	// MaxReferenceLen is the longest reference, in printable ASCII
	// characters other than space.
	MaxReferenceLen = 128
)

// ValidMetadata returns an *Error naming the first limit m exceeds: too
// many keys, a key that is empty, too long or has a character outside
// [A-Za-z0-9_.:-], or a value that is empty, too long, not UTF-8 or has a
// control character. The keys are checked in sorted order, so the error is
// the same for the same metadata.
func ValidMetadata(m map[string]string) error {
	if len(m) > MaxMetadataKeys {
		return Errorf(CodeInvalidRequest, "metadata has %d keys, over the limit of %d", len(m), MaxMetadataKeys)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := validMetadataKey(k); err != nil {
			return err
		}
		v := m[k]
		switch {
		case v == "":
			return Errorf(CodeInvalidRequest, "metadata[%s] is empty: leave the key out instead", k)
		case len(v) > MaxMetadataValueBytes:
			return Errorf(CodeInvalidRequest, "metadata[%s] is %d bytes, over the limit of %d", k, len(v), MaxMetadataValueBytes)
		case !utf8.ValidString(v):
			return Errorf(CodeInvalidRequest, "metadata[%s] is not valid UTF-8", k)
		case hasControl(v):
			return Errorf(CodeInvalidRequest, "metadata[%s] has a control character", k)
		}
	}
	return nil
}

// validMetadataKey checks one metadata key.
func validMetadataKey(k string) error {
	if k == "" || len(k) > MaxMetadataKeyLen {
		return Errorf(CodeInvalidRequest, "metadata key %s must be 1-%d characters", quoteShort(k), MaxMetadataKeyLen)
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == ':' || r == '-') {
			return Errorf(CodeInvalidRequest, "metadata key %s has a character outside [A-Za-z0-9_.:-]", quoteShort(k))
		}
	}
	return nil
}

// ValidLabels returns an *Error naming the first limit a request's
// reference (when given) or metadata exceeds.
func ValidLabels(reference string, metadata map[string]string) error {
	if reference != "" {
		if err := ValidReference(reference); err != nil {
			return err
		}
	}
	return ValidMetadata(metadata)
}

// ValidReference returns an *Error unless ref is a client's reference (an
// order or payment ID of its own): 1-MaxReferenceLen printable ASCII
// characters other than space.
func ValidReference(ref string) error {
	if ref == "" || len(ref) > MaxReferenceLen {
		return Errorf(CodeInvalidRequest, "reference must be 1-%d characters, got %d", MaxReferenceLen, len(ref))
	}
	for _, r := range ref {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' {
			return Errorf(CodeInvalidRequest, "reference %s has a character outside printable ASCII, or a space", quoteShort(ref))
		}
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// quoteShort quotes s for an error message, cut to 48 bytes.
func quoteShort(s string) string {
	if len(s) > 48 {
		return fmt.Sprintf("%s…", strconv.Quote(s[:48]))
	}
	return strconv.Quote(s)
}
