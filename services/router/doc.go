// Package router routes transfer commands to the home region of their
// source account (read from the ID prefix), stores and forwards them across
// regions with a stable Nats-Msg-Id, and relays each region's transactional
// outbox to the next step of a cross-region transfer.
package router
