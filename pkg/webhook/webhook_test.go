package webhook_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/pkg/webhook"
)

// TestSignKnownVector signs the Standard Webhooks specification's example
// and gets its signature.
func TestSignKnownVector(t *testing.T) {
	h := http.Header{}
	err := webhook.Sign(h, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`),
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.Get(webhook.HeaderSignature), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature %q, want the specification's %q", got, want)
	}
	if h.Get(webhook.HeaderID) != "msg_p5jXN8AQM9LWM0D4loKWxJek" || h.Get(webhook.HeaderTimestamp) != "1614265330" {
		t.Fatalf("headers %v", h)
	}
	// Its timestamp is years old: a replay.
	if _, err := webhook.Verify(h, []byte(`{"test": 2432232314}`), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"); !errors.Is(err, webhook.ErrTimestamp) {
		t.Fatalf("the specification's delivery verified now: %v, want ErrTimestamp", err)
	}
}

// TestVerifyRefuses verifies a fresh delivery and refuses each spoiled
// copy of it with the reason.
func TestVerifyRefuses(t *testing.T) {
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := webhook.NewSecret()
	if secret == other || !strings.HasPrefix(secret, webhook.SecretPrefix) {
		t.Fatalf("secrets %q and %q", secret, other)
	}
	body := []byte(`{"id":"eu-ev-1","type":"transfer.completed"}`)
	signed := func(at time.Time, secrets ...string) http.Header {
		h := http.Header{}
		if err := webhook.Sign(h, "eu-ev-1", at, body, secrets...); err != nil {
			t.Fatal(err)
		}
		return h
	}
	if id, err := webhook.Verify(signed(time.Now(), secret), body, secret); err != nil || id != "eu-ev-1" {
		t.Fatalf("a fresh delivery: %q, %v", id, err)
	}
	without := func(name string) http.Header { h := signed(time.Now(), secret); h.Del(name); return h }
	moved := signed(time.Now(), secret)
	moved.Set(webhook.HeaderID, "eu-ev-2")
	for _, c := range []struct {
		name    string
		h       http.Header
		body    string
		secrets []string
		want    error
	}{
		{"tampered body", signed(time.Now(), secret), `{"id":"eu-ev-1","type":"transfer.refunded"}`, []string{secret}, webhook.ErrSignature},
		{"another event's ID", moved, string(body), []string{secret}, webhook.ErrSignature},
		{"wrong secret", signed(time.Now(), other), string(body), []string{secret}, webhook.ErrSignature},
		{"old timestamp", signed(time.Now().Add(-webhook.Tolerance-time.Minute), secret), string(body), []string{secret}, webhook.ErrTimestamp},
		{"future timestamp", signed(time.Now().Add(webhook.Tolerance+time.Minute), secret), string(body), []string{secret}, webhook.ErrTimestamp},
		{"no ID", without(webhook.HeaderID), string(body), []string{secret}, webhook.ErrHeaders},
		{"no timestamp", without(webhook.HeaderTimestamp), string(body), []string{secret}, webhook.ErrHeaders},
		{"no signature", without(webhook.HeaderSignature), string(body), []string{secret}, webhook.ErrHeaders},
		{"no secret", signed(time.Now(), secret), string(body), nil, webhook.ErrSecret},
		{"not a secret", signed(time.Now(), secret), string(body), []string{"hunter2"}, webhook.ErrSecret},
	} {
		if _, err := webhook.Verify(c.h, []byte(c.body), c.secrets...); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if err := webhook.Sign(http.Header{}, "eu-ev-1", time.Now(), body, "whsec_!!"); !errors.Is(err, webhook.ErrSecret) {
		t.Errorf("signing with a malformed secret: %v, want ErrSecret", err)
	}
}

// TestRotation signs with the new secret and the old one while a secret is
// rotated: a receiver that has either verifies.
func TestRotation(t *testing.T) {
	old, _ := webhook.NewSecret()
	next, _ := webhook.NewSecret()
	body := []byte(`{}`)
	h := http.Header{}
	if err := webhook.Sign(h, "eu-ev-9", time.Now(), body, next, old); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{old, next} {
		if _, err := webhook.Verify(h, body, s); err != nil {
			t.Errorf("a receiver with one of the two: %v", err)
		}
	}
	single := http.Header{}
	_ = webhook.Sign(single, "eu-ev-9", time.Now(), body, next)
	if _, err := webhook.Verify(single, body, "whsec_"+strings.Repeat("A", 44), next); err != nil {
		t.Errorf("a receiver with the old and the new verifies a delivery signed with the new: %v", err)
	}
}
