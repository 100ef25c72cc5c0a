package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// PurposeForged marks a command a region's ledger or API user tried to
// publish straight into another region's ledger stream (scenario 12). The
// server must refuse it, so it is recorded as failed: I3 then requires
// that it has no effect.
const PurposeForged = "forged"

// forgery is scenario 12's state: a connection per region as its ledger,
// API and router users, each counting the permission violations the
// server reports.
type forgery struct {
	conns    map[string]*nats.Conn // "<service>-<region>"
	attempts atomic.Int64
	refused  atomic.Int64
	// classForged counts what the servers let an API user publish but its
	// class does not carry, by where it went: as its region's client
	// commands (the ledger must dead-letter them, wrong_class) and into
	// its region's route stream (the router must refuse them).
	classForged struct{ ledger, route atomic.Int64 }
}

func (f *forgery) connect(e *env) error {
	f.conns = map[string]*nats.Conn{}
	services := []string{"ledger", "api", "router"}
	if e.cfg.forgeAs != "" && !slices.Contains(services, e.cfg.forgeAs) {
		services = append(services, e.cfg.forgeAs)
	}
	for _, r := range e.names {
		for _, service := range services {
			nc, name, err := connectAs(e, r, service, &f.refused)
			if err != nil {
				return err
			}
			f.conns[name] = nc
		}
	}
	return nil
}

// connectAs connects to region r's server as its user of service
// (platform/natsauth), counting in refused each publish the server
// refuses it. It returns the connection and the user's name.
func connectAs(e *env, r, service string, refused *atomic.Int64) (*nats.Conn, string, error) {
	u, err := natsauth.UserOf(r, service)
	if err != nil {
		return nil, "", err
	}
	opts := append(natsauth.ConnectOptions(u.Name, u.Password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if publishRefused(err) {
			refused.Add(1)
		}
	}))
	nc, err := nats.Connect(e.topo.ClientURL(r), opts...)
	if err != nil {
		return nil, "", fmt.Errorf("connect as %s: %w", u.Name, err)
	}
	return nc, u.Name, nil
}

// publishRefused reports whether err is a server's report that it
// refused a publish of the connection (a permission violation).
func publishRefused(err error) bool {
	return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), "Publish")
}

func (f *forgery) close() {
	for _, nc := range f.conns {
		nc.Close()
	}
}

// forge publishes, as a region's ledger or API user, a transfer into
// another region's ledger subjects, and a forwarded API call as a ledger
// user: both must be refused.
func (f *forgery) forge(e *env) {
	from := e.names[e.intn(len(e.names))]
	to := from
	for to == from {
		to = e.names[e.intn(len(e.names))]
	}
	service := []string{"ledger", "api"}[e.intn(2)]
	if e.cfg.forgeAs != "" {
		service = e.cfg.forgeAs
	}
	nc := f.conns[natsauth.UserName(service, from)]
	src, dst := e.accts[to][e.intn(len(e.accts[to]))], e.accts[to][e.intn(len(e.accts[to]))]
	for dst == src {
		dst = e.accts[to][e.intn(len(e.accts[to]))]
	}
	n := f.attempts.Add(1)
	cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: e.id(to), ClientID: clientID,
		IdempotencyKey: fmt.Sprintf("s%d-forged-%d", e.seed, n), From: src, To: dst, Amount: 1 + int64(e.intn(1000)),
		Currency: "EUR", CreatedAt: time.Now()}
	i := e.hist.Invoke(Op{Client: cmd.ClientID, Key: cmd.IdempotencyKey, Body: e.body(cmd), Path: "forged", Via: from,
		Purpose: PurposeForged, Transfer: cmd.TransferID, cmd: cmd})
	m := nats.NewMsg(ledgerstream.Topology{Region: to, Shards: shards}.Subject(src, subjects.ClassCommand, from))
	m.Data = cmd.Encode()
	m.Header.Set("Nats-Msg-Id", cmd.MsgKey())
	_ = nc.PublishMsg(m)
	_ = nc.Flush()
	e.hist.Complete(i, Fail, "published as "+natsauth.UserName(service, from)+": must be refused", "")
	if service == "ledger" { // a forwarded API call from a non-API user
		f.attempts.Add(1)
		_ = nc.Publish("paymesh.api."+to, []byte(`{}`))
		_ = nc.Flush()
	}
}

// forgeRouter publishes, as a region's router user, what only another
// credential may send: a credit step in another region's name, or a
// fund, each straight to a ledger's subjects. The server must refuse both
// (a router relays only its own region's steps, and only the operator
// funds), and neither may have an effect (I3).
func (f *forgery) forgeRouter(e *env) {
	from := e.names[e.intn(len(e.names))]
	other := from
	for other == from {
		other = e.names[e.intn(len(e.names))]
	}
	to := e.names[e.intn(len(e.names))]
	acct := e.accts[to][e.intn(len(e.accts[to]))]
	n := f.attempts.Add(1)
	topo := ledgerstream.Topology{Region: to, Shards: shards}
	cmd := ledger.Command{Type: ledger.TypeCredit, TransferID: e.id(other), ClientID: clientID,
		IdempotencyKey: fmt.Sprintf("s%d-forged-step-%d", e.seed, n), From: e.accts[other][e.intn(len(e.accts[other]))], To: acct,
		Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()}
	subject := topo.Subject(acct, subjects.ClassStep, other) // in other's name
	b := e.body(cmd)
	if n%2 == 0 {
		cmd = ledger.Command{Type: ledger.TypeFund, TransferID: e.id(to), ClientID: "ops", IdempotencyKey: fmt.Sprintf("s%d-forged-fund-by-router-%d", e.seed, n),
			To: acct, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()}
		subject = topo.Subject(acct, subjects.ClassOps, from)
		b = e.body(cmd)
		b.From = ""
	}
	user := natsauth.UserName("router", from)
	i := e.hist.Invoke(Op{Client: cmd.ClientID, Key: cmd.IdempotencyKey, Body: b, Path: "forged", Via: from, Purpose: PurposeForged,
		Transfer: cmd.TransferID, cmd: cmd})
	m := nats.NewMsg(subject)
	m.Data = cmd.Encode()
	m.Header.Set("Nats-Msg-Id", cmd.MsgKey())
	_ = f.conns[user].PublishMsg(m)
	_ = f.conns[user].Flush()
	e.hist.Complete(i, Fail, "published as "+user+" on "+subject+": must be refused", "")
}

// forgeClass publishes, as a region's API user, what the servers let it
// publish but its class does not carry, with money in it: a fund, or a
// credit step of a transfer no other region debited, as a client command
// of its region's ledger, or a fund into its region's route stream. The
// ledger must dead-letter the first (wrong_class) and the router refuse
// the second; neither may have an effect (I3, and the saga check for the
// credit).
func (f *forgery) forgeClass(e *env) {
	r := e.names[e.intn(len(e.names))]
	other := r
	for other == r {
		other = e.names[e.intn(len(e.names))]
	}
	to := e.accts[r][e.intn(len(e.accts[r]))]
	n := f.classForged.ledger.Load() + f.classForged.route.Load()
	cmd := ledger.Command{Type: ledger.TypeFund, TransferID: e.id(r), ClientID: "ops", IdempotencyKey: fmt.Sprintf("s%d-forged-fund-%d", e.seed, n),
		To: to, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()}
	topo := ledgerstream.Topology{Region: r, Shards: shards}
	subject, into := topo.Subject(to, subjects.ClassCommand, r), &f.classForged.ledger
	switch n % 3 {
	case 1: // a credit in another region's name, as a client command
		cmd.Type, cmd.TransferID, cmd.ClientID = ledger.TypeCredit, e.id(other), clientID
		cmd.From, cmd.IdempotencyKey = e.accts[other][e.intn(len(e.accts[other]))], fmt.Sprintf("s%d-forged-credit-%d", e.seed, n)
	case 2: // a fund into the route stream
		subject, into = subjects.RouteShard(r, r, topo.Shard(to)), &f.classForged.route
	}
	b := e.body(cmd)
	if cmd.Type == ledger.TypeFund {
		b.From = ""
	}
	i := e.hist.Invoke(Op{Client: cmd.ClientID, Key: cmd.IdempotencyKey, Body: b, Path: "forged", Via: r, Purpose: PurposeForged,
		Transfer: cmd.TransferID, cmd: cmd})
	m := nats.NewMsg(subject)
	m.Data = cmd.Encode()
	m.Header.Set("Nats-Msg-Id", cmd.MsgKey())
	nc := f.conns[natsauth.UserName("api", r)]
	_ = nc.PublishMsg(m)
	_ = nc.Flush()
	into.Add(1)
	e.hist.Complete(i, Fail, "published as "+natsauth.UserName("api", r)+" on "+subject+": its class must refuse it", "")
}

// classRefused checks that every class forgery was refused where it went:
// dead-lettered wrong_class by the ledger, or refused by the router.
func (f *forgery) classRefused(ctx context.Context, e *env) Check {
	chk := Check{Name: "wrong class", What: "every fund or saga step an API user sent as a client command was dead-lettered " +
		"(wrong_class), and every one it put in its route stream was refused by the router", OK: true,
		Checked: f.classForged.ledger.Load() + f.classForged.route.Load()}
	var dead, refused int64
	for _, n := range e.names {
		r := e.c.Region(n)
		refused += r.Router.Stats().Refused.Load()
		got, err := deadLettered(ctx, r.Ledger.JetStream(), r.Ledger.Topo.DLQStream(), ledgerstream.ReasonWrongClass)
		if err != nil {
			chk.fail("%s: %v", n, err)
		}
		dead += got
	}
	if want := f.classForged.ledger.Load(); dead != want {
		chk.fail("%d sent as client commands, %d dead-lettered wrong_class", want, dead)
	}
	if want := f.classForged.route.Load(); refused != want {
		chk.fail("%d put in route streams, %d refused by the routers", want, refused)
	}
	return chk
}

// deadLettered counts the dead letters of stream with reason.
func deadLettered(ctx context.Context, js jetstream.JetStream, stream, reason string) (int64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if m.Header.Get(ledgerstream.HeaderDLQReason) == reason {
			n++
		}
	}
	return n, nil
}

// permissionsScenario is the scenario 12 inside the suite: while
// the workload runs, every region's ledger and API users keep trying to
// publish transfers into other regions' ledger streams, its ledger users
// to send forwarded API calls, and its router users to send saga steps in
// another region's name and funds. Each must be refused by the server
// (the fault counter counts refusals; a check compares them with the
// attempts), and none may have an effect (I3: the forged keys are recorded
// as failed).
func permissionsScenario() *scenario {
	f := &forgery{}
	return &scenario{
		name: "12-nats-permissions",
		what: "region ledger and API users publish forged transfers into other regions' ledger subjects, ledger users " +
			"forwarded API calls, and router users credit steps in another region's name and funds, every 50 ms; the servers " +
			"must refuse every one (deploy/regions users and permissions). " +
			"API users also send what their permissions allow but their class does not carry (a fund or a saga step as " +
			"a client command, a fund into the route stream): the ledger and the router must refuse each",
		counts: "forbidden publishes the servers refused",
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			if err := f.connect(e); err != nil {
				return err
			}
			defer f.close()
			err := every(ctx, 50*time.Millisecond, func() {
				f.forge(e)
				f.forgeRouter(e)
				f.forgeClass(e)
			})
			// The servers report violations asynchronously.
			deadline := time.Now().Add(2 * time.Second)
			for f.refused.Load() < f.attempts.Load() && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			return err
		},
		fired: func(*env) int64 { return f.refused.Load() },
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			chk := Check{Name: "refused", What: "every forbidden publish was refused by the server", OK: true, Checked: f.attempts.Load()}
			if a, r := f.attempts.Load(), f.refused.Load(); r != a {
				chk.fail("%d forbidden publishes, %d refused", a, r)
			}
			return []Check{chk, f.classRefused(ctx, e)}, nil
		},
	}
}

func init() { registry = append(registry, permissionsScenario) }
