package apid_test

import (
	"context"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/services/api/apid"
)

// TestOpenRejectsStreamReplicas: a replica count JetStream refuses fails
// Open at once, before it connects to anything (the URLs lead nowhere).
func TestOpenRejectsStreamReplicas(t *testing.T) {
	for _, n := range []int{-1, 6} {
		_, err := apid.Open(context.Background(), apid.Config{Region: "eu", PostgresURL: "postgres://127.0.0.1:1/none", NATSURL: "nats://127.0.0.1:1", StreamReplicas: n})
		if err == nil || !strings.Contains(err.Error(), "want 1 to 5") {
			t.Errorf("StreamReplicas %d: got %v, want the replica count refused", n, err)
		}
	}
}
