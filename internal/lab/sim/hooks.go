package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/lab/hookaudit"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// The reference receiver's audit: once the load has drained, every event
// of the load's client in every region must be applied once at compose's
// receiver, or failed at paymesh with its attempts (internal/lab/hookaudit,
// as the demo and the fault suite audit theirs).
const (
	hookDrainQuiet = 10 * time.Second // no delivery moved for this long: the audit says what is stuck
	hookDrainBound = 2 * time.Minute
)

// receiverService is the compose service that runs paymesh receiver, or
// "" when the file has none.
func (s *sim) receiverService() string {
	for _, name := range s.plan.of(kindService) {
		if cmd := s.plan.project.Services[name].Command; len(cmd) > 0 && cmd[0] == "receiver" {
			return name
		}
	}
	return ""
}

// receiverDB opens the receiver's database as the receiver does (its
// mapped PAYMESH_RECEIVER_POSTGRES_URL and PAYMESH_RECEIVER_DATABASE).
func (s *sim) receiverDB(ctx context.Context, name string) (*pgxpool.Pool, error) {
	env, err := s.env(name)
	if err != nil {
		return nil, err
	}
	url := env["PAYMESH_RECEIVER_POSTGRES_URL"]
	if db := env["PAYMESH_RECEIVER_DATABASE"]; db != "" {
		if url, err = pgdb.WithDatabase(url, db); err != nil {
			return nil, err
		}
	}
	pool, err := postgres.Connect(ctx, url, 30*time.Second, 0)
	if err != nil {
		return nil, fmt.Errorf("sim: %s's database: %w", name, err)
	}
	s.pools = append(s.pools, pool)
	return pool, nil
}

// auditHooks drains the deliveries to the receiver's endpoint, asks for
// some again, drains them and audits the receiver; nil when compose runs
// no receiver.
func (s *sim) auditHooks(ctx context.Context, client string) (*HooksAudit, error) {
	name := s.receiverService()
	if name == "" {
		return nil, nil
	}
	s.setPhase("webhooks")
	recv, err := s.receiverDB(ctx, name)
	if err != nil {
		return nil, err
	}
	t := hookaudit.Target{Client: client, Receiver: recv}
	for _, r := range s.table.Regions {
		t.Regions = append(t.Regions, hookaudit.Region{Name: r.Name, Pool: s.stores[r.Name].Pool()})
	}
	// The client's one endpoint, the receiver's (compose's receiver-setup
	// made it), read from the first region's copy.
	err = t.Regions[0].Pool.QueryRow(ctx, `SELECT id FROM webhook_endpoints WHERE client_id = $1 AND status <> 'deleted'
		ORDER BY created_at LIMIT 1`, client).Scan(&t.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("sim: the receiver's endpoint (client %s): %w", client, err)
	}
	if err := t.Drain(ctx, hookDrainQuiet, hookDrainBound); err != nil {
		return nil, err
	}
	// One event in a hundred sent again on the client's request: each
	// a duplicate the receiver must recognise.
	cl, err := s.clientAPI()
	if err != nil {
		return nil, err
	}
	n, err := t.Redeliver(ctx, cl, 100)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if err := t.Drain(ctx, hookDrainQuiet, hookDrainBound); err != nil {
		return nil, err
	}
	a, err := t.Run(ctx)
	if err != nil {
		return nil, fmt.Errorf("sim: audit the receiver: %w", err)
	}
	return &HooksAudit{Audit: a, Redelivered: n}, nil
}

// HooksAudit is the receiver's audit and the redeliveries the simulation
// asked for.
type HooksAudit struct {
	hookaudit.Audit
	Redelivered int64
}

// OK reports whether nothing was lost or doubled, and every redelivery
// came as a duplicate (each duplicate an attempt past an event's first).
func (h HooksAudit) OK() bool {
	return h.Audit.OK() && h.Redelivered <= h.Duplicated() && h.Duplicated() <= h.Attempts-h.Events
}

// clientAPI is the load's client on the first region's API, with the key
// compose's setup registers (PAYMESH_CLIENT_KEY).
func (s *sim) clientAPI() (*api.Client, error) {
	u, err := s.endpoints()
	if err != nil {
		return nil, err
	}
	for _, name := range s.plan.of(kindSetup) {
		if key := s.plan.project.Services[name].Environment["PAYMESH_CLIENT_KEY"]; key != "" {
			return &api.Client{BaseURL: u.APIs[s.table.Regions[0].Name], APIKey: key}, nil
		}
	}
	return nil, fmt.Errorf("sim: no setup service of docker-compose.yml sets PAYMESH_CLIENT_KEY")
}
