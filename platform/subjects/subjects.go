// Package subjects is the one definition of paymesh's NATS stream and
// subject names. The ledger's streams (services/ledger/ledgerstream), the
// router's (services/router), the API's forwarded calls (services/api) and
// the servers' permissions (platform/natsauth) all take their names
// from here, so a name is spelled once.
//
// Region <r>'s streams and subjects:
//
//	ROUTE_<R>   route.<r>.<home>.<shard>  commands accepted in <r> for accounts homed in <home>
//	LEDGER_<R>  ledger.<r>.<shard>        commands and saga steps that <r>'s ledger applies
//	DLQ_<R>     dlq.<r>.ledger            <r>'s dead letters
//	            paymesh.api.<r>           API calls forwarded to <r>'s API (request/reply)
//	            paymesh.answers.<r>.<p>   <r>'s ledger telling API process <p> which keys it answered
package subjects

import (
	"fmt"
	"strings"
)

// LedgerStream is the name of region's ledger stream.
func LedgerStream(region string) string { return "LEDGER_" + strings.ToUpper(region) }

// Ledger is the wildcard of region's ledger subjects.
func Ledger(region string) string { return "ledger." + region + ".>" }

// LedgerShard is the ledger subject of one shard of region.
func LedgerShard(region string, shard int) string { return fmt.Sprintf("ledger.%s.%d", region, shard) }

// AllLedgers matches the ledger subjects of every region.
const AllLedgers = "ledger.>"

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

// LedgerOfRoute maps a route subject route.<r>.<home>.<shard> to the home
// region's ledger subject ledger.<home>.<shard>. It returns an error for a
// subject of any other shape.
func LedgerOfRoute(route string) (string, error) {
	parts := strings.Split(route, ".")
	if len(parts) != 4 || parts[0] != "route" {
		return "", fmt.Errorf("route subject %q is not route.<region>.<home>.<shard>", route)
	}
	return "ledger." + parts[2] + "." + parts[3], nil
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
