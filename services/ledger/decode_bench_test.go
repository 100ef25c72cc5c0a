package ledger_test

import (
	"testing"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

func BenchmarkDecodeCommand(b *testing.B) {
	c := ledger.Command{Type: ledger.TypeTransfer, TransferID: "eu-0000000000001", ClientID: "c1", IdempotencyKey: "k-123456",
		From: "eu-00000000000ab", To: "eu-00000000000cd", Amount: 250, Currency: "EUR", CreatedAt: time.Now().UTC()}
	data := c.Encode()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ledger.DecodeCommand(data); err != nil {
			b.Fatal(err)
		}
	}
}
