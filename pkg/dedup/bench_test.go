package dedup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/pkg/dedup"
)

// BenchmarkClaimBatch claims a batch of keys in a transaction and commits,
// as the ledger's apply does before its writes (ClaimForTx): First claims
// of new keys, and Duplicate answers for keys claimed before (the insert
// conflicts and the rows are read back). ns/op is per batch; keys/s counts
// keys.
func BenchmarkClaimBatch(b *testing.B) {
	for _, size := range []int{1, 128} {
		for _, dup := range []bool{false, true} {
			name := fmt.Sprintf("size=%d/first", size)
			if dup {
				name = fmt.Sprintf("size=%d/duplicate", size)
			}
			b.Run(name, func(b *testing.B) {
				l, pool, _ := mustLog(b, dedup.Config{})
				ctx := context.Background()
				claim := func(keys []dedup.Key, want dedup.Outcome) {
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						cs, err := l.ClaimForTx(ctx, tx, "ledger", keys)
						if err == nil && cs[0].Outcome != want {
							err = fmt.Errorf("claim: got %v, want %v", cs[0].Outcome, want)
						}
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				now := time.Now()
				batch := func(n int) []dedup.Key {
					keys := make([]dedup.Key, size)
					for j := range keys {
						keys[j] = dedup.Key{ID: fmt.Sprintf("xfer/bench/%d-%d", n, j), Origin: now, Fingerprint: []byte{byte(j)}}
					}
					return keys
				}
				if dup {
					claim(batch(0), dedup.First)
				}
				n := 0
				start := time.Now()
				for b.Loop() {
					if dup {
						claim(batch(0), dedup.Duplicate)
					} else {
						n++
						claim(batch(n), dedup.First)
					}
				}
				b.ReportMetric(float64(b.N*size)/time.Since(start).Seconds(), "keys/s")
			})
		}
	}
}
