package postgres_test

import (
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
)

func BenchmarkApply(b *testing.B) {
	for _, size := range []int{1, 64, 256} {
		b.Run(map[int]string{1: "Batch1", 64: "Batch64", 256: "Batch256"}[size], func(b *testing.B) {
			f := ledgertest.New(b)
			accts := make([]string, 1000)
			for i := range accts {
				accts[i] = f.Account(b, "EUR", 1_000_000)
			}
			b.ResetTimer()
			start := time.Now()
			n := 0
			for range b.N {
				cmds := make([]ledger.Command, size)
				for j := range cmds {
					cmds[j] = f.Transfer(b, accts[(n+j)%1000], accts[(n+j+7)%1000], 1)
				}
				n += size
				f.Apply(b, cmds...)
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "transfers/s")
		})
	}
}
