package ledger_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// TestLabelLimits refuses metadata and references past each documented
// limit with a message that names it, and takes them at the limit.
func TestLabelLimits(t *testing.T) {
	many := map[string]string{}
	for i := range ledger.MaxMetadataKeys + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	atLimit := map[string]string{strings.Repeat("k", ledger.MaxMetadataKeyLen): strings.Repeat("é", ledger.MaxMetadataValueBytes/2)}
	for i := range ledger.MaxMetadataKeys - 1 {
		atLimit[fmt.Sprintf("key.%d:x-y_z", i)] = "v"
	}
	if err := ledger.ValidMetadata(atLimit); err != nil {
		t.Fatalf("metadata at every limit: %v", err)
	}
	for name, tt := range map[string]struct {
		md   map[string]string
		want string
	}{
		"too many keys": {many, "over the limit of 20"},
		"empty key":     {map[string]string{"": "v"}, "1-40 characters"},
		"long key":      {map[string]string{strings.Repeat("k", ledger.MaxMetadataKeyLen+1): "v"}, "1-40 characters"},
		"bracket":       {map[string]string{"a[b]": "v"}, "outside [A-Za-z0-9_.:-]"},
		"space in key":  {map[string]string{"a b": "v"}, "outside [A-Za-z0-9_.:-]"},
		"empty value":   {map[string]string{"a": ""}, "is empty"},
		"long value":    {map[string]string{"a": strings.Repeat("v", ledger.MaxMetadataValueBytes+1)}, "over the limit of 500"},
		"not UTF-8":     {map[string]string{"a": "\xff"}, "not valid UTF-8"},
		"control":       {map[string]string{"a": "x\ny"}, "control character"},
	} {
		err := ledger.ValidMetadata(tt.md)
		if ledger.ErrorCode(err) != ledger.CodeInvalidRequest || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want invalid_request naming %q", name, err, tt.want)
		}
	}
	for ref, want := range map[string]string{
		"": "1-128 characters",
		strings.Repeat("r", ledger.MaxReferenceLen+1): "1-128 characters",
		"order 1": "or a space",
		"ordré":   "outside printable ASCII",
	} {
		if err := ledger.ValidReference(ref); ledger.ErrorCode(err) != ledger.CodeInvalidRequest || !strings.Contains(err.Error(), want) {
			t.Errorf("reference %q: got %v, want invalid_request naming %q", ref, err, want)
		}
	}
	if err := ledger.ValidReference("order/2026-12/" + strings.Repeat("9", ledger.MaxReferenceLen-14)); err != nil {
		t.Errorf("a reference at the limit: %v", err)
	}
}

// TestLabelsInCommands keeps a command's reference and metadata through its
// encoding, makes them part of its fingerprint (length-prefixed: no two
// labelings hash alike), and refuses them where only a transfer, fund or
// refund takes them.
func TestLabelsInCommands(t *testing.T) {
	regions, id := mustIDs(t)
	c := ledger.Command{Type: ledger.TypeTransfer, TransferID: id("eu"), ClientID: "c1", IdempotencyKey: "k1",
		From: id("eu"), To: id("eu"), Amount: 250, Currency: "EUR", CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
		Reference: "order-1", Metadata: map[string]string{"shop": "north", "order": "o-1"}}
	if err := c.Validate("eu", regions, time.Now()); err != nil {
		t.Fatal(err)
	}
	got, err := ledger.DecodeCommand(c.Encode())
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("decoded %+v %v, want %+v", got, err, c)
	}
	with := func(ref string, md map[string]string) []byte {
		x := c
		x.Reference, x.Metadata = ref, md
		return x.Fingerprint()
	}
	same := with("order-1", map[string]string{"order": "o-1", "shop": "north"})
	for name, fp := range map[string][]byte{
		"no labels":          with("", nil),
		"another reference":  with("order-2", c.Metadata),
		"no reference":       with("", c.Metadata),
		"another value":      with("order-1", map[string]string{"order": "o-1", "shop": "south"}),
		"a key fewer":        with("order-1", map[string]string{"order": "o-1"}),
		"key and value move": with("order-1", map[string]string{"order": "o-1", "shopn": "orth"}),
	} {
		if bytes.Equal(fp, same) {
			t.Errorf("%s: same fingerprint as the request", name)
		}
	}
	if !bytes.Equal(c.Fingerprint(), same) {
		t.Error("the same labels in another order hash apart")
	}
	if bytes.Equal(with("", map[string]string{"ab": "c"}), with("", map[string]string{"a": "bc"})) {
		t.Error("metadata {ab: c} and {a: bc} hash alike")
	}

	bad := c
	bad.Metadata = map[string]string{"a": ""}
	if err := bad.Validate("eu", regions, time.Now()); ledger.ErrorCode(err) != ledger.CodeInvalidRequest {
		t.Errorf("empty metadata value: %v", err)
	}
	void := ledger.Command{Type: ledger.TypeVoid, TransferID: c.TransferID, ClientID: "c1", IdempotencyKey: "k2",
		From: c.From, To: c.To, Currency: "EUR", CreatedAt: c.CreatedAt, Reference: "order-3"}
	if err := void.Validate("eu", regions, time.Now()); err == nil || !strings.Contains(err.Error(), "has no reference or metadata") {
		t.Errorf("a void with a reference: %v", err)
	}
	step := c.Step(ledger.TypeCredit, "")
	if step.Reference != "" || step.Metadata != nil {
		t.Errorf("a saga step carries the request's labels: %+v", step)
	}
}
