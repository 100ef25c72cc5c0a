package router

import "sync/atomic"

// Stats counts what a router did. The zero value is ready.
type Stats struct {
	Submitted         atomic.Int64 // commands stored in the local route stream, or in the local ledger stream (Direct)
	Direct            atomic.Int64 // of Submitted, commands homed here, stored straight in the ledger stream
	DuplicateSubmits  atomic.Int64 // submits the route stream recognised by Nats-Msg-Id
	Forwarded         atomic.Int64 // commands the home region acked
	ForwardRetries    atomic.Int64 // forwards that failed and will be retried
	ForwardDuplicates atomic.Int64 // forwards the home stream recognised by Nats-Msg-Id
	Relayed           atomic.Int64 // outbox steps the destination acked
	RelayRetries      atomic.Int64 // relays that failed and will be retried
	RelayDuplicates   atomic.Int64 // relays the destination recognised by Nats-Msg-Id
	Refused           atomic.Int64 // route-stream messages not forwarded: no client command, or no route subject
}
