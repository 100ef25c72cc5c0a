package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

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

// forgery is scenario 12's state: a connection per region as its ledger
// user and as its API user, each counting the permission violations the
// server reports.
type forgery struct {
	conns    map[string]*nats.Conn // "<service>-<region>"
	attempts atomic.Int64
	refused  atomic.Int64
}

func (f *forgery) connect(e *env) error {
	f.conns = map[string]*nats.Conn{}
	for _, r := range e.names {
		for _, service := range append([]string{"ledger", "api"}, e.cfg.forgeAs) {
			if service == "" {
				continue
			}
			u, err := natsauth.UserOf(r, service)
			if err != nil {
				return err
			}
			opts := append(natsauth.ConnectOptions(u.Name, u.Password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), "Publish") {
					f.refused.Add(1)
				}
			}))
			nc, err := nats.Connect(e.topo.ClientURL(r), opts...)
			if err != nil {
				return fmt.Errorf("connect as %s: %w", u.Name, err)
			}
			f.conns[u.Name] = nc
		}
	}
	return nil
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

// permissionsScenario is the scenario 12 inside the suite: while
// the workload runs, every region's ledger and API users keep trying to
// publish transfers into other regions' ledger streams, and its ledger
// users to send forwarded API calls. Each must be refused by the server
// (the fault counter counts refusals; a check compares them with the
// attempts), and none may have an effect (I3: the forged keys are recorded
// as failed).
func permissionsScenario() *scenario {
	f := &forgery{}
	return &scenario{
		name: "12-nats-permissions",
		what: "region ledger and API users publish forged transfers into other regions' ledger subjects, and ledger users " +
			"forwarded API calls, every 50 ms; the servers must refuse every one (deploy/regions users and permissions)",
		counts: "forbidden publishes the servers refused",
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			if err := f.connect(e); err != nil {
				return err
			}
			defer f.close()
			err := every(ctx, 50*time.Millisecond, func() { f.forge(e) })
			// The servers report violations asynchronously.
			deadline := time.Now().Add(2 * time.Second)
			for f.refused.Load() < f.attempts.Load() && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			return err
		},
		fired: func(*env) int64 { return f.refused.Load() },
		extra: func(context.Context, *env) ([]Check, error) {
			chk := Check{Name: "refused", What: "every forbidden publish was refused by the server", OK: true, Checked: f.attempts.Load()}
			if a, r := f.attempts.Load(), f.refused.Load(); r != a {
				chk.fail("%d forbidden publishes, %d refused", a, r)
			}
			return []Check{chk}, nil
		},
	}
}

func init() { registry = append(registry, permissionsScenario) }
