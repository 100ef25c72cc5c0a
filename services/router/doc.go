// Package router will route transfer commands to the home region of their
// source account (read from the ID prefix), store and forward them across
// regions with a stable Nats-Msg-Id, and relay each region's transactional
// outbox to the next step of a cross-region transfer.
package router
