// Package api will serve paymesh's JSON HTTP API in every region: accounts
// and transfers, with Idempotency-Key replay stored in the home region of the
// source account, RFC 9457 problem details, and forwarding of any ID to its
// home region over NATS.
package api
