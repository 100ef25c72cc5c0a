// Package natsauth is the one definition of who may connect to paymesh's
// nats-servers and what each may publish and subscribe to. The embedded
// topology (internal/testbed/natsembed) configures its servers from it, and
// deploy/regions/nats/*.conf carry the same users for docker-compose
// (deploy/regions/natsconf_test.go fails when the two differ).
//
// The model: permissions are enforced by the region's own server, the one
// every service of the region connects to. Each region's server has one user
// per service (ledger-<r>, router-<r>, api-<r>, and ops-<r> for the
// operator), and no anonymous access. A
// message that another region's server receives over the leafnode link was
// already checked against its publisher's permissions in the publisher's
// region. So:
//
//   - a ledger subject names its class and the region it is sent from
//     (ledger.<region>.<shard>.<class>.<from>, platform/subjects), and each
//     class has its own publishers: client commands (cmd) the API of the
//     command's region, to its own region's ledger only, and the router of
//     region <r> forwarding its route stream (from <r>, to any region);
//     saga steps (step) only the ledger that wrote them to its outbox,
//     right after its commit, and the router of that region, which relays
//     the outbox (from <r>, to any region); the operator's commands (ops:
//     funds and dead letters replayed) only ops-<r>, to its own region; a
//     region's ledger publishes no other ledger subject. The ledger checks
//     each command's class again on receipt (services/ledger/ledgerstream,
//     checkClass);
//   - the ledger reaches only its own streams (LEDGER_<R>, DLQ_<R>) and the
//     router only ROUTE_<R>, through the local JetStream API ($JS.API.>);
//     no user may use another domain's API ($JS.<domain>.API.>), so no region
//     reads, purges or deletes another's streams;
//   - the operator's user (ops-<r>, paymesh dlq) reads DLQ_<R> and
//     deletes from it, reads LEDGER_<R> and its consumers' progress, and
//     publishes the operator's class of its own region's ledger subjects:
//     a fund, or a dead letter replayed on its original shard;
//   - only API users may send forwarded API calls (paymesh.api.<region>), and
//     only region <r>'s API user may receive those for <r>; it answers them
//     through allow_responses, not through a publish right on _INBOX.>;
//   - only region <r>'s ledger may publish, and only its API users
//     receive, the answer notifications paymesh.answers.<r>.<process>
//     (which keys a committed batch answered; they carry no answer, so a
//     forged one can only make an API read its keys early);
//   - every user has an inbox of its own (_INBOX.<user>, set by
//     ConnectOptions), so no service reads another's replies.
//
// The hub takes no clients: its only client user may neither publish nor
// subscribe, and each region's server joins it as a leafnode with a user of
// its own (leaf-<r>).
//
// The passwords are fixed and public: DEVELOPMENT ONLY. A deployment keeps
// the users and permissions and replaces the passwords (or uses nkeys or
// credentials files) from its secret store.
package natsauth

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/paymesh/paymesh/platform/subjects"
)

// The services that connect to a region's server.
const (
	Ledger = "ledger"
	Router = "router"
	API    = "api"
	// Ops is the operator's dead-letter tool (paymesh dlq).
	Ops = "ops"
)

// Services lists the services that have a user on every region's server.
var Services = []string{Ledger, Router, API, Ops}

// User is one user of a server.
type User struct {
	Name     string
	Password string
	// Permissions restrict the user; nil leaves it unrestricted (a region's
	// server joining the hub as a leafnode).
	Permissions *Permissions
}

// Permissions are a user's allow and deny lists. With an allow list, what
// it does not match is refused; a deny entry wins over an allow entry.
type Permissions struct {
	PublishAllow, PublishDeny     []string
	SubscribeAllow, SubscribeDeny []string
	// AllowResponses lets the user publish the reply to each request it
	// received (once, within the server's default window).
	AllowResponses bool
}

// UserName is the user of service in region.
func UserName(service, region string) string { return service + "-" + region }

// LeafUserName is the user with which region's server joins the hub.
func LeafUserName(region string) string { return "leaf-" + region }

// HubUserName is the hub's only client user; it may do nothing.
const HubUserName = "hub-nobody"

// DevPassword is user's password in the embedded topology and in
// docker-compose. DEVELOPMENT ONLY: it is public.
func DevPassword(user string) string { return "dev-only-" + user + "-not-a-secret" }

// InboxPrefix is the prefix of user's reply subjects; its users may
// subscribe only below their own.
func InboxPrefix(user string) string { return "_INBOX." + user }

// ConnectOptions authenticate a connection as user and give it the user's
// inbox prefix. With an empty user there are none: the server takes
// anonymous clients (a single test server).
func ConnectOptions(user, password string) []nats.Option {
	if user == "" {
		return nil
	}
	return []nats.Option{nats.UserInfo(user, password), nats.CustomInboxPrefix(InboxPrefix(user))}
}

// streamAPI is the local JetStream API of one stream: its stream and
// consumer requests, message reads and pull requests.
func streamAPI(stream string) []string {
	return []string{
		"$JS.API.STREAM.*." + stream,       // CREATE, UPDATE, INFO, ...
		"$JS.API.STREAM.MSG.GET." + stream, // a message by sequence or subject
		"$JS.API.DIRECT.GET." + stream,     // the same, answered by any replica
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.CONSUMER.*." + stream,        // LIST, NAMES
		"$JS.API.CONSUMER.*." + stream + ".>", // CREATE (with filter), INFO, DELETE
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".>",
	}
}

// acks are the acknowledgements of a stream's deliveries.
func acks(stream string) string { return "$JS.ACK." + stream + ".>" }

// accountInfo is the account's JetStream information, read by clients that
// check JetStream is there.
const accountInfo = "$JS.API.INFO"

// Users are the users of region's server.
func Users(region string) []User {
	ledger, router, api, ops := UserName(Ledger, region), UserName(Router, region), UserName(API, region), UserName(Ops, region)
	ledgerStream, dlqStream := subjects.LedgerStream(region), subjects.DLQStream(region)
	inbox := func(user string) string { return InboxPrefix(user) + ".>" }
	return []User{
		{
			Name: ledger, Password: DevPassword(ledger),
			Permissions: &Permissions{
				PublishAllow: concat(
					[]string{accountInfo, acks(subjects.LedgerStream(region)), subjects.DLQ(region),
						// After COMMIT: which keys it answered, to the APIs that wait,
						// and the saga steps the batch wrote, to any region (the
						// relay sends those it could not).
						subjects.AnswersOf(region), subjects.LedgerClass("*", subjects.ClassStep, region)},
					streamAPI(subjects.LedgerStream(region)), streamAPI(subjects.DLQStream(region))),
				SubscribeAllow: []string{inbox(ledger)},
			},
		},
		{
			Name: router, Password: DevPassword(router),
			Permissions: &Permissions{
				PublishAllow: concat(
					[]string{accountInfo, acks(subjects.RouteStream(region)), subjects.Route(region),
						// Client commands forwarded from its route stream, and
						// the saga steps of its region's outbox, to any region.
						subjects.LedgerClass("*", subjects.ClassCommand, region),
						subjects.LedgerClass("*", subjects.ClassStep, region)},
					streamAPI(subjects.RouteStream(region))),
				SubscribeAllow: []string{inbox(router)},
			},
		},
		{
			Name: api, Password: DevPassword(api),
			Permissions: &Permissions{
				PublishAllow: []string{accountInfo, subjects.Route(region), subjects.AllAPIs,
					// Client commands of its own region, nothing else.
					subjects.LedgerClass(region, subjects.ClassCommand, region),
					// The API makes sure its region's route stream exists
					// before it submits (a router may start after it).
					"$JS.API.STREAM.INFO." + subjects.RouteStream(region),
					"$JS.API.STREAM.CREATE." + subjects.RouteStream(region),
					"$JS.API.STREAM.UPDATE." + subjects.RouteStream(region)},
				SubscribeAllow: []string{subjects.API(region), subjects.AnswersOf(region), inbox(api)},
				AllowResponses: true,
			},
		},
		{
			Name: ops, Password: DevPassword(ops),
			Permissions: &Permissions{
				PublishAllow: []string{accountInfo, subjects.LedgerClass(region, subjects.ClassOps, region),
					"$JS.API.STREAM.INFO." + dlqStream, "$JS.API.STREAM.MSG.GET." + dlqStream,
					"$JS.API.STREAM.MSG.DELETE." + dlqStream,
					"$JS.API.STREAM.INFO." + ledgerStream, "$JS.API.STREAM.MSG.GET." + ledgerStream,
					"$JS.API.CONSUMER.INFO." + ledgerStream + ".*"},
				SubscribeAllow: []string{inbox(ops)},
			},
		},
	}
}

// UserOf returns service's user on region's server.
func UserOf(region, service string) (User, error) {
	name := UserName(service, region)
	for _, u := range Users(region) {
		if u.Name == name {
			return u, nil
		}
	}
	return User{}, fmt.Errorf("natsauth: no service %q", service)
}

// HubUsers are the hub's client users: one that may do nothing, so that the
// hub refuses every anonymous client.
func HubUsers() []User {
	return []User{{Name: HubUserName, Password: DevPassword(HubUserName),
		Permissions: &Permissions{PublishDeny: []string{">"}, SubscribeDeny: []string{">"}}}}
}

// LeafUsers are the users with which the regions' servers join the hub.
func LeafUsers(regions []string) []User {
	out := make([]User, len(regions))
	for i, r := range regions {
		out[i] = User{Name: LeafUserName(r), Password: DevPassword(LeafUserName(r))}
	}
	return out
}

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// Conf renders users as the value of a nats-server config's users field,
// each line after the first indented by indent: the text of
// deploy/regions/nats/*.conf, which deploy/regions/natsconf_test.go parses
// and compares with these definitions.
func Conf(users []User, indent string) string {
	var b strings.Builder
	line := func(depth int, format string, args ...any) {
		b.WriteString(indent + strings.Repeat("  ", depth) + fmt.Sprintf(format, args...) + "\n")
	}
	list := func(depth int, key string, subjects []string) {
		if subjects == nil {
			return
		}
		if len(subjects) == 1 {
			line(depth, "%s: [%q]", key, subjects[0])
			return
		}
		line(depth, "%s: [", key)
		for _, s := range subjects {
			line(depth+1, "%q,", s)
		}
		line(depth, "]")
	}
	perm := func(key string, allow, deny []string) {
		if allow == nil && deny == nil {
			return
		}
		line(3, "%s: {", key)
		list(4, "allow", allow)
		list(4, "deny", deny)
		line(3, "}")
	}
	b.WriteString("[\n")
	for _, u := range users {
		line(1, "{")
		line(2, "user: %q", u.Name)
		line(2, "password: %q", u.Password)
		if p := u.Permissions; p != nil {
			line(2, "permissions: {")
			perm("publish", p.PublishAllow, p.PublishDeny)
			perm("subscribe", p.SubscribeAllow, p.SubscribeDeny)
			if p.AllowResponses {
				line(3, "allow_responses: true")
			}
			line(2, "}")
		}
		line(1, "}")
	}
	b.WriteString(indent + "]")
	return b.String()
}
