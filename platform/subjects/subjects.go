// Package subjects is the one definition of paymesh's NATS stream and
// subject names. The ledger's streams (services/ledger/ledgerstream), the
// router's (services/router), the API's forwarded calls (services/api) and
// the servers' permissions (platform/natsauth) all take their names
// from here, so a name is spelled once.
//
// Region <r>'s streams and subjects:
//
//	ROUTE_<R>   route.<r>.<home>.<shard>                client commands accepted in <r> for accounts homed in <home>
//	LEDGER_<R>  ledger.<r>.<shard>.<class>.<from>      what <r>'s ledger applies, by class, sent from region <from>
//	DLQ_<R>     dlq.<r>.ledger                          <r>'s dead letters
//	            paymesh.api.<r>                         API calls forwarded to <r>'s API (request/reply)
//	            paymesh.answers.<r>.<p>                 <r>'s ledger telling API process <p> which keys it answered
//
// A ledger subject names its class, so that the servers' permissions can
// give each class only to the services that own it, and the ledger can
// check that a command came the way its kind must come (Class).
package subjects

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// LedgerStream is the name of region's ledger stream.
func LedgerStream(region string) string { return "LEDGER_" + strings.ToUpper(region) }

// Ledger is the wildcard of region's ledger subjects.
func Ledger(region string) string { return "ledger." + region + ".>" }

// Class is the kind of traffic a ledger subject carries. Each class has
// its own publishers (platform/natsauth), and the ledger applies a command
// only from its kind's class.
type Class string

// The classes of ledger subjects.
const (
	// ClassCommand carries client commands (transfer, capture, void,
	// refund), from the API of the command's home region or a router
	// forwarding its route stream.
	ClassCommand Class = "cmd"
	// ClassStep carries saga steps, from the region whose ledger wrote
	// them to its outbox: that ledger, right after its commit, or the
	// region's router relaying the outbox.
	ClassStep Class = "step"
	// ClassOps carries the operator's commands (fund, and dead letters
	// replayed), from the region's own operator user.
	ClassOps Class = "ops"
)

// Classes lists every class.
var Classes = []Class{ClassCommand, ClassStep, ClassOps}

// LedgerSubject is the ledger subject of one shard of region, for class,
// sent from region from.
func LedgerSubject(region string, shard int, class Class, from string) string {
	return fmt.Sprintf("ledger.%s.%d.%s.%s", region, shard, class, from)
}

// LedgerShard is the wildcard of one shard of region: every class, from
// anywhere (a shard consumer's filter).
func LedgerShard(region string, shard int) string {
	return fmt.Sprintf("ledger.%s.%d.>", region, shard)
}

// LedgerClass is the wildcard of region's subjects of class sent from
// region from; "*" for either matches any (a permission).
func LedgerClass(region string, class Class, from string) string {
	return "ledger." + region + ".*." + string(class) + "." + from
}

// LedgerAddress is what a ledger subject says.
type LedgerAddress struct {
	Region string
	Shard  int
	Class  Class
	From   string
}

// ParseLedger reads a ledger subject. It returns an error for a subject of
// any other shape or an unknown class.
func ParseLedger(subject string) (LedgerAddress, error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 5 || parts[0] != "ledger" || parts[1] == "" || parts[4] == "" {
		return LedgerAddress{}, fmt.Errorf("ledger subject %q is not ledger.<region>.<shard>.<class>.<from>", subject)
	}
	shard, err := strconv.Atoi(parts[2])
	if err != nil || shard < 0 {
		return LedgerAddress{}, fmt.Errorf("ledger subject %q: shard %q is not a shard number", subject, parts[2])
	}
	c := Class(parts[3])
	if !slices.Contains(Classes, c) {
		return LedgerAddress{}, fmt.Errorf("ledger subject %q: %q is not a class (%v)", subject, parts[3], Classes)
	}
	return LedgerAddress{Region: parts[1], Shard: shard, Class: c, From: parts[4]}, nil
}

// DLQStream is the name of region's dead-letter stream.
func DLQStream(region string) string { return "DLQ_" + strings.ToUpper(region) }

// DLQ is the subject of region's dead letters.
func DLQ(region string) string { return "dlq." + region + ".ledger" }

// RouteStream is the name of region's route stream.
func RouteStream(region string) string { return "ROUTE_" + strings.ToUpper(region) }

// Route is the wildcard of every route subject of region.
func Route(region string) string { return "route." + region + ".>" }

// RouteHome is the wildcard of region's route subjects for accounts homed
// in home.
func RouteHome(region, home string) string { return "route." + region + "." + home + ".>" }

// RouteShard is the route subject, in region, of a shard of home.
func RouteShard(region, home string, shard int) string {
	return fmt.Sprintf("route.%s.%s.%d", region, home, shard)
}

// LedgerOfRoute maps a route subject route.<r>.<home>.<shard> to the
// subject its client command is forwarded to: the home region's ledger,
// class ClassCommand, sent from <r>. It returns an error for a subject of
// any other shape.
func LedgerOfRoute(route string) (string, error) {
	parts := strings.Split(route, ".")
	if len(parts) != 4 || parts[0] != "route" {
		return "", fmt.Errorf("route subject %q is not route.<region>.<home>.<shard>", route)
	}
	shard, err := strconv.Atoi(parts[3])
	if err != nil || shard < 0 {
		return "", fmt.Errorf("route subject %q: shard %q is not a shard number", route, parts[3])
	}
	return LedgerSubject(parts[2], shard, ClassCommand, parts[1]), nil
}

// API is where region's API takes forwarded calls.
func API(region string) string { return "paymesh.api." + region }

// AllAPIs matches every region's forwarded-call subject.
const AllAPIs = "paymesh.api.*"

// Answers is where region's ledger tells one API process of region (named
// by process, its node) which of the idempotency keys it submitted are
// answered.
func Answers(region, process string) string { return "paymesh.answers." + region + "." + process }

// AnswersOf matches the answer notifications of every API process of region.
func AnswersOf(region string) string { return "paymesh.answers." + region + ".*" }
