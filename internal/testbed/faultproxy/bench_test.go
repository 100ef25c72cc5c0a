package faultproxy_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy/faultproxytest"
)

// BenchmarkRelay measures a link's throughput: each op sends 1 MiB through
// the proxy to an echo server and reads it back. Latency must not cap it.
func BenchmarkRelay(b *testing.B) {
	for _, lat := range []time.Duration{0, 20 * time.Millisecond} {
		b.Run("latency="+lat.String(), func(b *testing.B) {
			p, err := faultproxy.New(faultproxytest.Echo(b))
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			p.SetShape(faultproxy.Shape{Latency: lat})
			c := dial(b, p.Addr())
			data := bytes.Repeat([]byte{'x'}, 1<<20)
			got := make([]byte, len(data))
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				go c.Write(data)
				if _, err := io.ReadFull(c, got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
