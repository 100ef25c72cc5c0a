// Package webhook signs paymesh's webhook deliveries and verifies them on
// the receiving side, as the Standard Webhooks specification
// (standardwebhooks.com) says, through its reference library:
//
//	webhook-id:        the event's ID (the same on every retry of it)
//	webhook-timestamp: the delivery's Unix time in seconds
//	webhook-signature: "v1,<base64 HMAC-SHA256 of id.timestamp.body>", one per
//	                   secret, space-separated while a secret is rotated
//
// The signature covers the event ID and the time as well as the body, so a
// receiver that refuses old timestamps (Tolerance) refuses a replayed
// delivery, and a body moved under another event's ID does not verify.
package webhook

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/standard-webhooks/standard-webhooks/libraries/go" // package standardwebhooks
)

// The headers of a delivery.
const (
	HeaderID        = standardwebhooks.HeaderWebhookID
	HeaderTimestamp = standardwebhooks.HeaderWebhookTimestamp
	HeaderSignature = standardwebhooks.HeaderWebhookSignature
)

// Headers paymesh adds to a delivery, outside the signature: hints that let
// a receiver name why an event came again (its attempt number, from 1, and
// how many times the event was redelivered on request). They are not
// signed, so a receiver uses them for counting only, never to decide an
// effect.
const (
	HeaderAttempt    = "Paymesh-Attempt"
	HeaderRedelivery = "Paymesh-Redelivery"
)

// Tolerance is how far a delivery's timestamp may be from the receiver's
// clock, either way: the reference library's fixed window.
const Tolerance = 5 * time.Minute

// SecretPrefix starts every signing secret; base64 of its key follows.
const SecretPrefix = "whsec_"

// secretBytes is the length of a new secret's key: SHA-256's block of 64
// bytes would be more than HMAC needs; 32 is its output size.
const secretBytes = 32

// The reasons Verify refuses a delivery.
var (
	ErrHeaders   = errors.New("webhook: a signature header is missing or malformed")
	ErrTimestamp = errors.New("webhook: timestamp outside the tolerance window")
	ErrSignature = errors.New("webhook: no signature matches")
	ErrSecret    = errors.New("webhook: not a signing secret")
)

// NewSecret returns a new signing secret: SecretPrefix and 32 random bytes
// in base64.
func NewSecret() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("webhook: new secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// CheckSecret refuses a string that is not a signing secret.
func CheckSecret(secret string) error {
	_, err := signer(secret)
	return err
}

// signer returns the library's signer of a secret, refusing one that is not
// SecretPrefix and base64 of a key.
func signer(secret string) (*standardwebhooks.Webhook, error) {
	if !strings.HasPrefix(secret, SecretPrefix) {
		return nil, fmt.Errorf("%w: it must start with %q", ErrSecret, SecretPrefix)
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSecret, err)
	}
	return wh, nil
}

// Sign sets the headers of a delivery of body, the event id, at time at,
// signed with each of secrets (the current one, and while it is rotated the
// one before).
func Sign(h http.Header, id string, at time.Time, body []byte, secrets ...string) error {
	if id == "" || len(secrets) == 0 {
		return fmt.Errorf("webhook: sign: want an event ID and at least one secret")
	}
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		wh, err := signer(s)
		if err != nil {
			return err
		}
		sig, err := wh.Sign(id, at, body)
		if err != nil {
			return fmt.Errorf("webhook: sign: %w", err)
		}
		sigs = append(sigs, sig)
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	h.Set(HeaderSignature, strings.Join(sigs, " "))
	return nil
}

// Verify checks a delivery against the receiver's secrets (any may match)
// and returns its event ID. It refuses, with an error that wraps one of
// ErrHeaders, ErrTimestamp, ErrSignature and ErrSecret, a delivery with a
// header missing, a timestamp more than Tolerance from now, or no signature
// made with one of secrets over this ID, timestamp and body.
func Verify(h http.Header, body []byte, secrets ...string) (string, error) {
	if len(secrets) == 0 {
		return "", fmt.Errorf("%w: no secret to verify with", ErrSecret)
	}
	var last error
	for _, s := range secrets {
		wh, err := signer(s)
		if err != nil {
			return "", err
		}
		switch err := wh.Verify(body, h); {
		case err == nil:
			return h.Get(HeaderID), nil
		case errors.Is(err, standardwebhooks.ErrRequiredHeaders), errors.Is(err, standardwebhooks.ErrInvalidHeaders):
			return "", fmt.Errorf("%w (%s, %s and %s are required)", ErrHeaders, HeaderID, HeaderTimestamp, HeaderSignature)
		case errors.Is(err, standardwebhooks.ErrMessageTooOld), errors.Is(err, standardwebhooks.ErrMessageTooNew):
			return "", fmt.Errorf("%w (%s, within %s of now): %s", ErrTimestamp, h.Get(HeaderTimestamp), Tolerance, err)
		default:
			last = err
		}
	}
	return "", fmt.Errorf("%w: %v", ErrSignature, last)
}
