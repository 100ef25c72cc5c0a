// Command paymesh runs paymesh's services (ledger, router, api), its
// operator tools (migrate, verify, client), the API client commands, load,
// the demo and the bench.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgconn"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/bench"
	"github.com/paymesh/paymesh/internal/lab/chaos"
	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/internal/lab/demo"
	"github.com/paymesh/paymesh/internal/lab/loadgen"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/startup"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/regiondb"
	"github.com/paymesh/paymesh/services/router/routerd"
)

// errFailed makes main exit 1 after a command already printed why.
var errFailed = errors.New("failed")

type cli struct {
	RegionsFile string `name:"regions-file" env:"PAYMESH_REGIONS_FILE" help:"Region table (default: the built-in deploy/regions/regions.yaml)." type:"existingfile"`
	Verbose     bool   `short:"v" help:"Log debug messages."`

	Demo      demoCmd      `cmd:"" help:"Run the three-region demo in one process: transfers (half cross-region) with injected duplicates and faults, a live page, then the global invariant report."`
	Bench     benchCmd     `cmd:"" help:"Measure throughput and latency on the local Postgres and an embedded nats-server, against baselines run alongside."`
	Chaos     chaosCmd     `cmd:"" help:"Run the fault-injection scenarios on a three-region cluster and check the ledger's invariants against the recorded history."`
	Ledger    ledgerCmd    `cmd:"" help:"Run a region's ledger: consume its JetStream stream and apply transfers exactly once."`
	Router    routerCmd    `cmd:"" help:"Run a region's router: forward its route stream to the home regions and relay its ledger's outbox."`
	API       apiCmd       `cmd:"" name:"api" help:"Serve a region's HTTP API."`
	Client    clientCmd    `cmd:"" help:"Register an API client (or, with --operator, an operator) in every region (or those of --region) and print its API key."`
	Accounts  accountsCmd  `cmd:"" help:"Open and show accounts through the HTTP API."`
	Load      loadCmd      `cmd:"" help:"Drive transfers through running regions' HTTP APIs (the demo's with --stay, or docker-compose)."`
	Transfers transfersCmd `cmd:"" help:"Send and show transfers through the HTTP API."`
	Verify    verifyCmd    `cmd:"" help:"Check a region's ledger invariants and print PASS/FAIL for each."`
	Migrate   migrateCmd   `cmd:"" help:"Apply a region's database migrations (the ledger's and the API's) and create its consume-log partitions."`
	WAN       wanCmd       `cmd:"" name:"wan" help:"Run a region's WAN link to the hub: a TCP proxy with the table's latency, jitter, resets, cut and heal, and a control API."`
	DLQ       dlqCmd       `cmd:"" name:"dlq" help:"List, show, replay and discard a region's dead letters."`
	Sim       simCmd       `cmd:"" help:"Run docker-compose.yml's topology as processes on this machine, with load, a fault schedule, Prometheus and alerts, then a PASS/FAIL report."`
}

// regionDB names a region and its database.
type regionDB struct {
	Region      string `default:"eu" env:"PAYMESH_REGION" help:"Region name from the region table."`
	PostgresURL string `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server URL; its database is replaced by the region's (default: ${default_pg})."`
	Database    string `env:"PAYMESH_DATABASE" help:"Database name (default: the region's postgres.database)."`
}

func (r regionDB) resolve(t regions.Table) (regions.Region, string, error) {
	reg, ok := t.Get(r.Region)
	if !ok {
		return regions.Region{}, "", fmt.Errorf("unknown region %q", r.Region)
	}
	base := r.PostgresURL
	if base == "" {
		base = pgdb.DefaultURL
	}
	db := r.Database
	if db == "" {
		db = reg.Postgres.Database
	}
	url, err := pgdb.WithDatabase(base, db)
	return reg, url, err
}

// natsLogin is a service's user on its region's nats-server: in
// docker-compose one per region and service (deploy/regions/nats/*.conf,
// platform/natsauth); none for a server without users.
type natsLogin struct {
	NATSUser     string `name:"nats-user" env:"PAYMESH_NATS_USER" help:"User on the region's nats-server (ledger-<region>, router-<region> or api-<region>; none for a server without users)."`
	NATSPassword string `name:"nats-password" env:"PAYMESH_NATS_PASSWORD" help:"Password of --nats-user."`
}

// regionNATS is a service's region on NATS: its servers, its user there,
// and how many replicas the streams it creates keep.
type regionNATS struct {
	NATSURL string `name:"nats-url" env:"PAYMESH_NATS_URL" default:"nats://127.0.0.1:4222" help:"NATS servers of the region: one URL, or a comma-separated list (every server of the region's JetStream cluster, so the service survives the loss of one)."`
	natsLogin
	StreamReplicas int `name:"stream-replicas" env:"PAYMESH_STREAM_REPLICAS" default:"1" help:"Replicas of the streams this service creates or updates (1 to 5; 3 on a region cluster of three servers). An existing stream is scaled to it."`
}

// replicas returns --stream-replicas, or an error outside 1 to
// ledgerstream.MaxReplicas (0 is refused: the flag says what it means).
func (r regionNATS) replicas() (int, error) {
	if err := ledgerstream.CheckReplicas(r.StreamReplicas); err != nil {
		return 0, fmt.Errorf("--stream-replicas: %w", err)
	}
	return r.StreamReplicas, nil
}

// dependencyWait bounds how long a service waits at start for its Postgres
// and nats-server (docker-compose starts them together).
type dependencyWait struct {
	ConnectTimeout time.Duration `name:"connect-timeout" env:"PAYMESH_CONNECT_TIMEOUT" default:"60s" help:"How long to wait at start for Postgres and NATS to answer."`
}

// metricsListen returns where a service serves /metrics: flag, by default
// 127.0.0.1:port, and nowhere ("") when flag is "off".
func metricsListen(flag string, port int) string {
	switch flag {
	case "off":
		return ""
	case "":
		return fmt.Sprintf("127.0.0.1:%d", port)
	}
	return flag
}

// app is a service's app type (services/*/server).
type app interface {
	Run(ctx context.Context) error
	Close() error
}

// run runs a until ctx ends, then closes it. It returns Run's and Close's
// errors, joined.
func run(ctx context.Context, a app) error {
	err := a.Run(ctx)
	return errors.Join(err, a.Close())
}

type ledgerCmd struct {
	regionDB
	regionNATS
	Node       uint16        `env:"PAYMESH_NODE" default:"1" help:"Node id (0-1023) for the account IDs this process mints; leased in the region's database at start (refused while another live process holds it)."`
	Workers    int           `env:"PAYMESH_WORKERS" default:"2" help:"Consumers in this process."`
	BatchSize  int           `name:"batch-size" env:"PAYMESH_BATCH_SIZE" default:"${default_batch}" help:"Most messages applied in one transaction."`
	AckWait    time.Duration `name:"ack-wait" env:"PAYMESH_ACK_WAIT" default:"30s" help:"JetStream redelivery timeout."`
	MaxDeliver int           `name:"max-deliver" env:"PAYMESH_MAX_DELIVER" default:"10" help:"Deliveries before a message is dead-lettered."`
	Lease      time.Duration `env:"PAYMESH_LEASE" default:"30s" help:"Longest a transaction may sit idle before Postgres ends it and its claims pass on."`
	WindowDays int           `name:"dedup-window-days" env:"PAYMESH_DEDUP_WINDOW_DAYS" default:"7" help:"Days of consume-log kept."`
	CacheSize  int           `name:"cache-size" env:"PAYMESH_CACHE_SIZE" default:"100000" help:"Recently committed keys kept in memory (0 disables)."`
	Shards     int           `env:"PAYMESH_SHARDS" default:"16" help:"Ledger subjects per region."`
	OutboxKeep time.Duration `name:"outbox-retention" env:"PAYMESH_OUTBOX_RETENTION" default:"24h" help:"How long sent outbox rows are kept before they are deleted (negative keeps them all)."`
	ShardSet   string        `name:"shard-set" env:"PAYMESH_SHARD_SET" default:"0/1" help:"i/n: this process applies the shards k with k mod n = i. Give each ledger replica of a region its own i."`
	Metrics    string        `name:"metrics-listen" env:"PAYMESH_METRICS_LISTEN" help:"Address of /metrics (default: 127.0.0.1:<the region's metrics_port>; 'off' for none)."`
	dependencyWait
}

// ownShards parses --shard-set.
func (c *ledgerCmd) ownShards() ([]int, error) {
	var i, n int
	if _, err := fmt.Sscanf(c.ShardSet, "%d/%d", &i, &n); err != nil || n < 1 || i < 0 || i >= n || fmt.Sprintf("%d/%d", i, n) != c.ShardSet {
		return nil, fmt.Errorf("--shard-set %q: want i/n with 0 <= i < n", c.ShardSet)
	}
	if c.Shards < n {
		return nil, fmt.Errorf("--shard-set %q: only %d shards to share", c.ShardSet, c.Shards)
	}
	var own []int
	for k := i; k < c.Shards; k += n {
		own = append(own, k)
	}
	return own, nil
}

func (c *ledgerCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions, log *slog.Logger) error {
	reg, url, err := c.resolve(t)
	if err != nil {
		return err
	}
	own, err := c.ownShards()
	if err != nil {
		return err
	}
	replicas, err := c.replicas()
	if err != nil {
		return err
	}
	srv, err := ledgerd.Open(ctx, ledgerd.Config{OwnShards: own, StreamReplicas: replicas,
		Region: reg.Name, Regions: ids, Node: c.Node, PostgresURL: url, NATSURL: c.NATSURL, NATSUser: c.NATSUser, NATSPassword: c.NATSPassword, Workers: c.Workers,
		BatchSize: c.BatchSize, AckWait: c.AckWait, MaxDeliver: c.MaxDeliver, Lease: c.Lease,
		WindowDays: c.WindowDays, OutboxRetention: c.OutboxKeep, CacheSize: c.CacheSize, Shards: c.Shards, Log: log.With("service", "ledger"),
		Answers: apidb.Answers{}, AnswersSchema: new(apidb.Migrations()),
		MetricsListen: metricsListen(c.Metrics, reg.MetricsPort), ConnectTimeout: c.ConnectTimeout,
	})
	if err != nil {
		return err
	}
	return run(ctx, srv)
}

type verifyCmd struct {
	regionDB
	All        bool   `help:"Check every region of the region table, and the invariants across them."`
	DBPrefix   string `name:"database-prefix" env:"PAYMESH_DATABASE_PREFIX" help:"With --all: region databases are named <prefix><region> instead of the region table's."`
	Quiescent  bool   `help:"With --all: also require that nothing is in transit (run it once traffic has stopped)."`
	WindowDays int    `name:"dedup-window-days" env:"PAYMESH_DEDUP_WINDOW_DAYS" default:"7" help:"Days of consume-log kept."`
}

func (c *verifyCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions) error {
	names := []string{c.Region}
	if c.All {
		names = nil
		for _, r := range t.Regions {
			names = append(names, r.Name)
		}
	}
	var stores []*postgres.Store
	for _, name := range names {
		one := c.regionDB
		one.Region = name
		if c.All {
			one.Database = "" // each region's own database
			if c.DBPrefix != "" {
				one.Database = c.DBPrefix + name
			}
		}
		reg, url, err := one.resolve(t)
		if err != nil {
			return err
		}
		pool, err := postgres.Connect(ctx, url, time.Minute, 0)
		if err != nil {
			return fmt.Errorf("region %s: %w", reg.Name, err)
		}
		defer pool.Close()
		stores = append(stores, postgres.New(pool, postgres.Config{Region: reg.Name, Regions: ids,
			Dedup: dedup.New(dedup.Config{WindowDays: c.WindowDays})}))
	}
	var rep postgres.Report
	var err error
	if c.All {
		rep, err = postgres.VerifyGlobal(ctx, stores, c.Quiescent)
	} else {
		rep, err = stores[0].Verify(ctx)
	}
	if err != nil {
		return err
	}
	fmt.Print(rep.String())
	if !rep.OK() {
		return errFailed
	}
	return nil
}

type apiCmd struct {
	regionDB
	regionNATS
	OpsNATSUser     string        `name:"ops-nats-user" env:"PAYMESH_OPS_NATS_USER" help:"The region's operator user on the same nats-servers (ops-<region>): serve the operator endpoints on the region's dead letters (/v1/ops/...). Without it they answer 503."`
	OpsNATSPassword string        `name:"ops-nats-password" env:"PAYMESH_OPS_NATS_PASSWORD" help:"Password of --ops-nats-user."`
	Listen          string        `env:"PAYMESH_API_LISTEN" help:"Address to listen on (default: 127.0.0.1:<the region's api_port>)."`
	Node            uint16        `env:"PAYMESH_API_NODE" default:"2" help:"Node id (0-1023) for the transfer IDs this process mints; leased in the region's database at start (refused while another live process holds it)."`
	Shards          int           `env:"PAYMESH_SHARDS" default:"16" help:"Ledger subjects per region (as the ledgers)."`
	Wait            time.Duration `env:"PAYMESH_API_WAIT" default:"2s" help:"How long POST /v1/transfers waits for a final state before answering 202."`
	KeyTTL          time.Duration `name:"key-ttl" env:"PAYMESH_KEY_TTL" default:"24h" help:"How long idempotency keys are kept."`
	ClientCacheTTL  time.Duration `name:"client-cache-ttl" env:"PAYMESH_CLIENT_CACHE_TTL" default:"2s" help:"How long a client found by its API key is kept in memory; a revoked key keeps working for up to this long (0: no cache)."`
	ClaimKeys       bool          `name:"claim-keys" env:"PAYMESH_CLAIM_KEYS" help:"Claim every transfer's idempotency key in a commit of its own before submitting it (by default a request whose accounts this process has seen is submitted unclaimed, and the ledger's transaction stores its key). Claiming keeps 422 for a repeat with another body while the first is in flight in another API process of the region."`
	SubmitAll       bool          `name:"submit-all" env:"PAYMESH_SUBMIT_ALL" help:"Submit every transfer request to the region's ledger stream (by default the API applies them itself, in group commits of the ledger's own transaction, and submits only those it could not apply there)."`
	Metrics         string        `name:"metrics-listen" env:"PAYMESH_API_METRICS_LISTEN" help:"Address of /metrics (default: 127.0.0.1:<the region's api_metrics_port>; 'off' for none)."`
	dependencyWait
}

func (c *apiCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions, log *slog.Logger) error {
	reg, url, err := c.resolve(t)
	if err != nil {
		return err
	}
	replicas, err := c.replicas()
	if err != nil {
		return err
	}
	listen := c.Listen
	if listen == "" {
		listen = fmt.Sprintf("127.0.0.1:%d", reg.APIPort)
	}
	srv, err := apid.Open(ctx, apid.Config{StreamReplicas: replicas, Region: reg.Name, Regions: ids, Node: c.Node, PostgresURL: url,
		NATSURL: c.NATSURL, NATSUser: c.NATSUser, NATSPassword: c.NATSPassword, OpsNATSUser: c.OpsNATSUser, OpsNATSPassword: c.OpsNATSPassword,
		Shards: c.Shards, Wait: c.Wait, KeyTTL: c.KeyTTL, ClientCacheTTL: cmp.Or(c.ClientCacheTTL, -1), ClaimKeys: c.ClaimKeys, SubmitAll: c.SubmitAll,
		Listen: listen, MetricsListen: metricsListen(c.Metrics, reg.APIMetricsPort), ConnectTimeout: c.ConnectTimeout,
		Log: log.With("service", "api")})
	if err != nil {
		return err
	}
	return run(ctx, srv)
}

type clientCmd struct {
	PostgresURL string        `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server of the regions' databases (default: ${default_pg})."`
	DBPrefix    string        `name:"database-prefix" env:"PAYMESH_DATABASE_PREFIX" help:"Region databases are named <prefix><region> instead of the region table's."`
	URLs        []string      `name:"postgres-urls" env:"PAYMESH_POSTGRES_URLS" help:"region=URL of each region's Postgres server, when they differ (docker-compose)."`
	Regions     []string      `name:"region" help:"Register the client only in these regions, comma-separated (default: every region of the region table)."`
	ID          string        `arg:"" help:"Client id (1-64 characters)."`
	Name        string        `help:"Display name." default:""`
	Rate        int           `help:"Requests per second allowed." default:"100"`
	Overdraft   int64         `name:"max-overdraft" help:"Most overdraft (minor units) the client may give its accounts." default:"0"`
	Operator    bool          `help:"Register an operator instead of a client: its key reaches the operator endpoints (/v1/ops/..., the region's dead letters) and no account or transfer. The id is the operator's name in the dead-letter audit."`
	Key         string        `env:"PAYMESH_CLIENT_KEY" help:"Use this API key instead of a new random one (at least 16 characters)."`
	Wait        time.Duration `name:"connect-timeout" env:"PAYMESH_CONNECT_TIMEOUT" default:"60s" help:"How long to wait for a region's API to migrate its tables (docker-compose starts them together)."`
}

func (c *clientCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions, log *slog.Logger) error {
	if err := ledger.ValidClientID(c.ID); err != nil {
		return err
	}
	role := api.RoleClient
	if c.Operator {
		role = api.RoleOperator
		if c.Overdraft != 0 {
			return errors.New("--max-overdraft with --operator: an operator moves no money")
		}
	}
	key := c.Key
	if key == "" {
		raw := make([]byte, 24)
		if _, err := rand.Read(raw); err != nil {
			return err
		}
		key = "pm_" + hex.EncodeToString(raw)
	} else if len(key) < 16 {
		return fmt.Errorf("--key: an API key needs at least 16 characters")
	}
	servers := map[string]string{}
	for _, u := range c.URLs {
		region, url, ok := strings.Cut(u, "=")
		if !ok {
			return fmt.Errorf("--postgres-urls %q: want region=postgres://…", u)
		}
		servers[region] = url
	}
	names := c.Regions
	if len(names) == 0 {
		for _, r := range t.Regions {
			names = append(names, r.Name)
		}
	}
	// Open every region first: a missing database registers the client
	// nowhere, and the error says which one and what to run.
	stores := map[string]*apidb.Store{}
	var missing, found []string
	for _, name := range names {
		one := regionDB{Region: name, PostgresURL: c.PostgresURL}
		if u, ok := servers[name]; ok {
			one.PostgresURL = u
		}
		if c.DBPrefix != "" {
			one.Database = c.DBPrefix + name
		}
		reg, url, err := one.resolve(t)
		if err != nil {
			return err
		}
		pool, err := postgres.Connect(ctx, url, time.Minute, 0)
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "3D000" { // invalid_catalog_name
			db := one.Database
			if db == "" {
				db = reg.Postgres.Database
			}
			migrate := "paymesh migrate --region " + name
			if one.Database != "" {
				migrate += " --database " + one.Database
			}
			missing = append(missing, fmt.Sprintf("region %s: database %s does not exist; create it with `%s --create`", name, db, migrate))
			continue
		}
		if err != nil {
			return fmt.Errorf("region %s: %w", name, err)
		}
		defer pool.Close()
		stores[name] = apidb.New(pool)
		found = append(found, name)
	}
	if len(missing) > 0 {
		hint := "or register the client only in the regions you run with --region"
		if len(found) > 0 {
			hint += " (--region " + strings.Join(found, ",") + ")"
		}
		return fmt.Errorf("%s;\n%s", strings.Join(missing, ";\n"), hint)
	}
	for _, name := range names {
		put := func() error {
			return stores[name].PutClient(ctx, api.RegisteredClient{ID: c.ID, Name: c.Name, Role: role, RatePerSec: c.Rate, MaxOverdraft: c.Overdraft}, key)
		}
		if err := untilMigrated(ctx, name, c.Wait, log, put); err != nil {
			return fmt.Errorf("region %s: %w", name, err)
		}
	}
	fmt.Println(key)
	return nil
}

// untilMigrated runs f, and again every startup.Every for at most timeout
// while it fails because the region's API tables do not exist yet (its API
// migrates them at start), logging once that it waits. It returns f's last
// error, saying what to run when the tables never came.
func untilMigrated(ctx context.Context, region string, timeout time.Duration, log *slog.Logger, f func() error) error {
	err := startup.Wait(ctx, timeout, log.With("region", region), "waiting for the region's API to migrate its tables", func() error {
		err := f()
		var pgErr *pgconn.PgError
		if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != "42P01") { // 42P01: undefined_table
			return startup.Permanent(err)
		}
		return err
	})
	if late := (*startup.Timeout)(nil); errors.As(err, &late) {
		return fmt.Errorf("the database is not migrated after %s (start the region's API, or run `paymesh migrate --region %s`): %w", late.After, region, late.Err)
	}
	return err
}

// apiClient holds the flags of the client commands.
type apiClient struct {
	APIURL string `name:"api-url" env:"PAYMESH_API_URL" default:"http://127.0.0.1:8101" help:"Any region's API."`
	APIKey string `name:"api-key" env:"PAYMESH_API_KEY" required:"" help:"Your API key (paymesh client prints one)."`
}

func (a apiClient) client() *api.Client { return &api.Client{BaseURL: a.APIURL, APIKey: a.APIKey} }

// show prints an API answer, or its problem, and fails on a problem.
func show(r api.Response, err error) error {
	if len(r.Body) > 0 {
		fmt.Println(string(r.Body))
	}
	if r.Replayed {
		fmt.Fprintln(os.Stderr, "(replayed: the first response to this Idempotency-Key)")
	}
	if err != nil && len(r.Body) == 0 {
		return err
	}
	if err != nil {
		return errFailed
	}
	return nil
}

type accountsCmd struct {
	Create struct {
		apiClient
		Currency string `required:"" help:"ISO 4217 currency."`
		Region   string `help:"Home region (default: the region of --api-url)."`
		Floor    int64  `help:"Lowest balance allowed (0: no overdraft)."`
	} `cmd:"" help:"Open an account."`
	Show struct {
		apiClient
		ID      string `arg:"" help:"Account id."`
		Entries bool   `help:"Show its change-log instead."`
		After   int64  `help:"With --entries: start after this version."`
	} `cmd:"" help:"Show an account, from any region."`
}

func (c *accountsCmd) Run(ctx context.Context, k *kong.Context) error {
	switch k.Command() {
	case "accounts create":
		return show(c.Create.client().CreateAccount(ctx, c.Create.Currency, c.Create.Region, c.Create.Floor))
	default:
		path := "/v1/accounts/" + c.Show.ID
		if c.Show.Entries {
			path += fmt.Sprintf("/entries?after=%d", c.Show.After)
		}
		return show(c.Show.client().Get(ctx, path))
	}
}

type transfersCmd struct {
	Send struct {
		apiClient
		From     string `required:"" help:"Your source account."`
		To       string `required:"" help:"Destination account, in any region."`
		Amount   string `required:"" help:"Integer minor units (cents)."`
		Currency string `required:"" help:"ISO 4217 currency."`
		Key      string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
		Hold     bool   `help:"Authorize only: reserve the amount until a capture, a void or the expiry."`
		Expires  string `help:"With --hold: when it expires (RFC 3339, or a duration from now such as 30m; default 7 days)."`
	} `cmd:"" help:"Send a transfer (or a hold); retries safely on network errors."`
	Show struct {
		apiClient
		ID string `arg:"" help:"Transfer id."`
	} `cmd:"" help:"Show a transfer's status and legs, from any region."`
	Capture struct {
		apiClient
		ID     string `arg:"" help:"Hold id."`
		Amount string `help:"Integer minor units to capture (default: all of the hold)."`
		Key    string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
	} `cmd:"" help:"Capture a hold of yours, all of it or an amount; the rest is released."`
	Void struct {
		apiClient
		ID  string `arg:"" help:"Hold id."`
		Key string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
	} `cmd:"" help:"Release a hold of yours."`
	Refund struct {
		apiClient
		ID     string `arg:"" help:"Id of the transfer paid into your account."`
		Amount string `help:"Integer minor units to give back (default: all that is still refundable)."`
		Key    string `help:"Idempotency-Key (default: a new random one, printed, reused on retries)."`
	} `cmd:"" help:"Refund a transfer paid into your account, in part or whole."`
}

func (c *transfersCmd) Run(ctx context.Context, k *kong.Context) error {
	switch k.Command() {
	case "transfers show <id>":
		return show(c.Show.client().Get(ctx, "/v1/transfers/"+c.Show.ID))
	case "transfers capture <id>":
		amount, err := optionalAmount(c.Capture.Amount)
		if err != nil {
			return err
		}
		return show(c.Capture.client().Capture(ctx, c.Capture.ID, amount, idemKey(c.Capture.Key)))
	case "transfers void <id>":
		return show(c.Void.client().Void(ctx, c.Void.ID, idemKey(c.Void.Key)))
	case "transfers refund <id>":
		amount, err := optionalAmount(c.Refund.Amount)
		if err != nil {
			return err
		}
		return show(c.Refund.client().Refund(ctx, c.Refund.ID, amount, idemKey(c.Refund.Key)))
	}
	s := c.Send
	amount, err := ledger.ParseAmount(s.Amount)
	if err != nil {
		return err
	}
	req := api.TransferRequest{From: s.From, To: s.To, Amount: amount, Currency: s.Currency, Hold: s.Hold}
	if s.Expires != "" {
		if !s.Hold {
			return errors.New("--expires belongs to a hold (--hold)")
		}
		at, err := time.Parse(time.RFC3339, s.Expires)
		if err != nil {
			d, derr := time.ParseDuration(s.Expires)
			if derr != nil {
				return fmt.Errorf("--expires %q is neither an RFC 3339 time nor a duration", s.Expires)
			}
			at = time.Now().Add(d)
		}
		req.ExpiresAt = &at
	}
	return show(s.client().SendTransfer(ctx, req, idemKey(s.Key)))
}

// idemKey returns key, or a new random one, printed so that a retry by
// hand can reuse it.
func idemKey(key string) string {
	if key == "" {
		key = api.NewIdempotencyKey()
		fmt.Fprintf(os.Stderr, "Idempotency-Key: %s\n", key)
	}
	return key
}

// optionalAmount parses an amount flag; empty is 0 (all).
func optionalAmount(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := ledger.ParseAmount(s)
	if err == nil && n <= 0 {
		err = ledger.Errorf(ledger.CodeInvalidAmount, "amount %d must be positive", n)
	}
	return n, err
}

type loadCmd struct {
	APIs        []string      `name:"api" env:"PAYMESH_LOAD_APIS" default:"eu=http://127.0.0.1:8101,us=http://127.0.0.1:8102,ap=http://127.0.0.1:8103" help:"region=URL of each region's API."`
	APIKey      string        `name:"api-key" env:"PAYMESH_API_KEY" required:"" help:"API key of a client allowed the overdraft."`
	Accounts    int           `default:"5" help:"Accounts to open in each region."`
	Overdraft   int64         `default:"1000000" help:"Overdraft of each account (minor units); the client must be allowed it."`
	Transfers   int           `default:"2000" help:"Transfers to send."`
	Concurrency int           `default:"16" help:"Requests in flight."`
	Retry       float64       `default:"0.1" help:"Share of transfers sent again with the same key in another region."`
	Cross       float64       `default:"0.5" help:"Share of transfers between accounts of two regions."`
	History     string        `env:"PAYMESH_LOAD_HISTORY" help:"Write every acknowledged transfer request (key, client, region asked, status, transfer id) to this file as JSON lines." type:"path"`
	Client      string        `env:"PAYMESH_LOAD_CLIENT" help:"The API key's client id, written to --history."`
	Duration    time.Duration `help:"Stop sending after this long, even before --transfers (0: no limit)."`
	Seed        uint64        `default:"1" help:"Seed of the random load."`
	Faults      string        `help:"Fault plan to apply to the WAN links while the load runs: 'default', or items <cut|degrade>-<region>@<start>+<duration> such as cut-us@10s+5s,degrade-us@20s+15s."`
	WAN         []string      `name:"wan" env:"PAYMESH_LOAD_WAN" help:"region=URL of each region's WAN link control API (paymesh wan), for --faults."`
}

func (c *loadCmd) Run(ctx context.Context) error {
	apis, err := regionURLs("--api", c.APIs)
	if err != nil {
		return err
	}
	if c.Retry < 0 || c.Retry > 1 {
		return fmt.Errorf("--retry %v: a rate must be between 0 and 1", c.Retry)
	}
	runPlan := func(context.Context) error { return nil }
	if c.Faults != "" {
		if len(c.WAN) == 0 {
			return errors.New("--faults needs --wan region=URL of each WAN link's control API (paymesh wan --control)")
		}
		wan, err := regionURLs("--wan", c.WAN)
		if err != nil {
			return err
		}
		links := map[string]*faultproxy.Client{}
		var names []string
		for _, a := range c.WAN { // in the order given: "default" picks from it
			name, _, _ := strings.Cut(a, "=")
			names = append(names, name)
			links[name] = faultproxy.NewClient(wan[name])
		}
		plan, err := loadgen.ParsePlan(c.Faults, names)
		if err != nil {
			return fmt.Errorf("--faults: %w", err)
		}
		plan.Print(os.Stdout)
		runPlan = func(ctx context.Context) error { return loadgen.RunPlan(ctx, plan, links, os.Stdout) }
	}
	cfg := loadgen.Config{APIs: apis, APIKey: c.APIKey, Accounts: c.Accounts, Overdraft: c.Overdraft,
		Transfers: c.Transfers, Concurrency: c.Concurrency, Retry: c.Retry, Cross: c.Cross, Client: c.Client, Duration: c.Duration, Seed: c.Seed}
	if c.History != "" {
		f, err := os.Create(c.History)
		if err != nil {
			return err
		}
		defer f.Close()
		cfg.History = f
	}
	pctx, stopPlan := context.WithCancel(ctx)
	planErr := make(chan error, 1)
	go func() { planErr <- runPlan(pctx) }()
	res, err := loadgen.Run(ctx, cfg, os.Stdout)
	stopPlan() // heals the faults in force, skips those not yet due
	res.Print(os.Stdout)
	return errors.Join(err, <-planErr)
}

// regionURLs parses region=http://host:port items of flag.
func regionURLs(flag string, items []string) (map[string]string, error) {
	urls := map[string]string{}
	for _, a := range items {
		region, url, ok := strings.Cut(a, "=")
		if !ok || region == "" || !strings.HasPrefix(url, "http") {
			return nil, fmt.Errorf("%s %q: want region=http://host:port", flag, a)
		}
		urls[region] = url
	}
	return urls, nil
}

type routerCmd struct {
	regionDB
	regionNATS
	Shards  int           `env:"PAYMESH_SHARDS" default:"16" help:"Ledger subjects per region (as the ledgers)."`
	AckWait time.Duration `name:"ack-wait" env:"PAYMESH_ROUTER_ACK_WAIT" default:"10s" help:"How long a forward may take before it is retried."`
	Metrics string        `name:"metrics-listen" env:"PAYMESH_ROUTER_METRICS_LISTEN" help:"Address of /metrics (default: 127.0.0.1:<the region's router_metrics_port>; 'off' for none)."`
	dependencyWait
}

func (c *routerCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions, log *slog.Logger) error {
	reg, url, err := c.resolve(t)
	if err != nil {
		return err
	}
	replicas, err := c.replicas()
	if err != nil {
		return err
	}
	srv, err := routerd.Open(ctx, routerd.Config{StreamReplicas: replicas, Region: reg.Name, Regions: ids, PostgresURL: url,
		NATSURL: c.NATSURL, NATSUser: c.NATSUser, NATSPassword: c.NATSPassword, Shards: c.Shards, AckWait: c.AckWait,
		MetricsListen: metricsListen(c.Metrics, reg.RouterMetricsPort), ConnectTimeout: c.ConnectTimeout, Log: log})
	if err != nil {
		return err
	}
	return run(ctx, srv)
}

type migrateCmd struct {
	regionDB
	Create     bool `help:"Create the database first if it does not exist."`
	WindowDays int  `name:"dedup-window-days" env:"PAYMESH_DEDUP_WINDOW_DAYS" default:"7" help:"Days of consume-log kept."`
}

func (c *migrateCmd) Run(ctx context.Context, t regions.Table) error {
	reg, url, err := c.resolve(t)
	if err != nil {
		return err
	}
	if c.Create {
		base := c.PostgresURL
		if base == "" {
			base = pgdb.DefaultURL
		}
		db := c.Database
		if db == "" {
			db = reg.Postgres.Database
		}
		if _, err := pgdb.Create(ctx, base, db, false); err != nil {
			fmt.Fprintf(os.Stderr, "create database: %v (continuing)\n", err)
		}
	}
	pool, err := postgres.Connect(ctx, url, time.Minute, 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := postgres.New(pool, postgres.Config{Region: reg.Name, Dedup: dedup.New(dedup.Config{WindowDays: c.WindowDays})})
	if err := regiondb.Migrate(ctx, pool, regiondb.Schema{Ledger: store, API: new(apidb.Migrations()), DeadLetters: true}); err != nil {
		return err
	}
	fmt.Printf("region %s: database migrated\n", reg.Name)
	return nil
}

type demoCmd struct {
	PostgresURL   string  `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server on which to create the demo databases (default: ${default_pg})."`
	Accounts      int     `default:"50" help:"Accounts to open and fund in each region."`
	Transfers     int     `default:"20000" help:"Transfers to send (about half cross-region)."`
	Seed          uint64  `default:"1" help:"Seed of the random workload."`
	HTTPShare     float64 `name:"http-share" default:"0.05" help:"Share of transfers sent through the HTTP API; the rest go to the routers."`
	CrossShare    float64 `name:"cross-share" default:"0.5" help:"Share of transfers between two regions."`
	Rate          float64 `default:"0" help:"Transfers per second to send at most (0: as fast as they go)."`
	Holds         int     `default:"0" help:"Holds of the holds-and-refunds phase after the transfers: captured (a third in part), voided or left to expire (0: 1 % of --transfers, at least 30; -1: none)."`
	Refunds       int     `default:"0" help:"Completed transfers refunded by their payee in that phase, half of them twice (0: 0.5 % of --transfers, at least 15; -1: none)."`
	ClientRetry   float64 `name:"client-retry" default:"0.05" help:"Rate of client retries with the same key, in any region."`
	ProducerRetry float64 `name:"producer-retry" default:"0.05" help:"Rate of router re-publishes with the same Nats-Msg-Id."`
	DropAck       float64 `name:"drop-ack" default:"0.03" help:"Rate of committed ledger batches whose acks are dropped (forced redelivery)."`
	Poison        float64 `default:"0.002" help:"Rate of malformed messages."`
	Faults        string  `default:"cut-us,restart-eu-ledger,restart-ap-nats" help:"Faults to fire during the run, comma-separated (empty for none): cut-us (3 s), restart-eu-ledger, restart-ap-nats."`
	Report        string  `help:"Also write the report as JSON to this file."`
	Nodes         int     `default:"1" help:"nats-servers per region: 1, or 3 for a JetStream cluster with R3 streams (starts a few seconds slower)."`
	WAN           bool    `name:"wan" help:"Put the region table's WAN latency (deploy/regions/regions.yaml, wan round trips) on every region's link to the hub."`
	Stay          bool    `help:"Keep the regions, their APIs and the live page running after the report, until Ctrl-C."`
	Throwaway     bool    `name:"throwaway-postgres" help:"Use a throwaway PostgreSQL cluster from the local binaries even if a server answers."`
	Keep          bool    `help:"Keep the demo databases afterwards."`
	Dashboard     string  `default:"127.0.0.1:8100" help:"Address of the live page (throughput, duplicates by layer, invariants, alerts, traces with retries); 'off' for none."`
	Prometheus    string  `default:"auto" enum:"auto,on,off" help:"Run Debian's prometheus (make prometheus) with the alert rules of deploy/prometheus on the demo's /metrics: auto (when installed), on (fail without it), off."`

	traces *dashboard.Recorder
}

func (c *demoCmd) Run(ctx context.Context) error {
	if c.PostgresURL == "" {
		c.PostgresURL = pgdb.DefaultURL
	}
	if c.Rate < 0 {
		return fmt.Errorf("--rate %v must not be negative", c.Rate)
	}
	for name, r := range map[string]float64{"http-share": c.HTTPShare, "cross-share": c.CrossShare, "client-retry": c.ClientRetry, "producer-retry": c.ProducerRetry, "drop-ack": c.DropAck, "poison": c.Poison} {
		if r < 0 || r > 1 {
			return fmt.Errorf("--%s %v: a rate must be between 0 and 1", name, r)
		}
	}
	if c.Accounts < 2 || c.Transfers < 0 {
		return fmt.Errorf("need at least 2 accounts per region and a non-negative transfer count")
	}
	if c.Nodes != 1 && c.Nodes != 3 {
		return fmt.Errorf("--nodes %d: want 1 (one nats-server per region) or 3 (a JetStream cluster)", c.Nodes)
	}
	var faults []string
	for _, f := range strings.Split(c.Faults, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(demo.FaultNames, f) {
			return fmt.Errorf("--faults: unknown fault %q (known: %s)", f, strings.Join(demo.FaultNames, ", "))
		}
		faults = append(faults, f)
	}
	rep, err := demo.Run(ctx, demo.Config{
		PostgresURL: c.PostgresURL, Accounts: c.Accounts, Transfers: c.Transfers, Seed: c.Seed, HTTPShare: c.HTTPShare, Holds: c.Holds, Refunds: c.Refunds,
		CrossShare: max(c.CrossShare, 1e-9), Rate: c.Rate,
		ClientRetry: c.ClientRetry, ProducerRetry: c.ProducerRetry, DropAck: c.DropAck, Poison: c.Poison,
		FixedPorts: true, Nodes: c.Nodes, WAN: c.WAN, Stay: c.Stay, Keep: c.Keep, Live: isTerminal(os.Stdout), Faults: faults, ThrowawayPostgres: c.Throwaway,
		Dashboard: dashboardAddr(c.Dashboard), Traces: c.traces, Prometheus: c.Prometheus,
	}, os.Stdout)
	if err != nil {
		return err
	}
	if c.Report != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(c.Report, b, 0o644); err != nil {
			return err
		}
	}
	if !c.Stay {
		rep.Print(os.Stdout)
	}
	if !rep.OK() {
		return errFailed
	}
	return nil
}

type benchCmd struct {
	PostgresURL    string        `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server on which to create the bench databases (default: ${default_pg})."`
	DBPrefix       string        `name:"database-prefix" help:"Name the bench databases <prefix><scenario> (default paymesh_bench_): two runs on one server need different prefixes, or they drop each other's databases."`
	Scenarios      []string      `help:"Scenarios to run, comma-separated (default: all): uniform, replay, latency, replicas (topology start at R1 and R3, uniform again at R3), hot, dedup-table, naive, ceiling (the apply transaction's SQL alone), tpcb, cross-region, api, api-process (paymesh api, router and ledger as processes, the load from the bench), ledger-process. uniform always runs: the others are compared with it."`
	Accounts       int           `help:"Accounts to open and fund (default 10000; --quick 2000)."`
	Transfers      int           `help:"Transfers per full-speed run (default 200000; --quick 30000)."`
	BatchSize      int           `name:"batch-size" help:"Most messages per ledger transaction (default: the ledger's, ${default_batch})."`
	BatchSizes     []int         `name:"batch-sizes" help:"Also run uniform at each of these batch sizes, comma-separated, and name the fastest."`
	Workers        int           `help:"Ledger consumers (default 2, as paymesh ledger)."`
	Shards         int           `help:"Ledger subjects (default ${default_shards})."`
	Window         int           `help:"Most transfers published but not yet committed (default 4096)."`
	APITransfers   int           `name:"api-transfers" help:"Transfers the api scenario sends through the HTTP API (default 20000; --quick 4000)."`
	APIConcurrency []int         `name:"api-concurrency" help:"Requests in flight of each api run, comma-separated (default 64,256); the first is the headline figure."`
	DedupRows      int64         `name:"dedup-rows" help:"Consume-log rows written before the dedup-table run (default 10000000; --quick 1000000)."`
	Limit          time.Duration `help:"Longest publish phase of a full-speed run (default 60s; --quick 15s)."`
	Quick          bool          `help:"A run of about a minute: fewer accounts, transfers and consume-log rows, shorter baselines."`
	JSON           string        `name:"json" help:"Write the results as JSON to this file." type:"path"`
	CPUProfile     string        `name:"cpuprofile" help:"Write a CPU profile of the uniform run to this file." type:"path"`
	APIProfile     string        `name:"api-cpuprofile" help:"Write a CPU profile of the first api run (its requests, not its set-up) to this file." type:"path"`
	Keep           bool          `help:"Keep the bench databases afterwards."`
	Seed           uint64        `default:"1" help:"Seed of the random workload."`
}

func (c *benchCmd) Run(ctx context.Context) error {
	self, _ := os.Executable() // the ledger-process scenario runs `paymesh ledger` from it
	res, err := bench.Run(ctx, bench.Config{LedgerBinary: self,
		PostgresURL: c.PostgresURL, DatabasePrefix: c.DBPrefix, Scenarios: c.Scenarios, Accounts: c.Accounts, Transfers: c.Transfers,
		BatchSize: c.BatchSize, BatchSizes: c.BatchSizes, Workers: c.Workers, Shards: c.Shards, Window: c.Window,
		APITransfers: c.APITransfers, APIConcurrency: c.APIConcurrency, DedupRows: c.DedupRows, Limit: c.Limit, Quick: c.Quick, Keep: c.Keep, CPUProfile: c.CPUProfile, APIProfile: c.APIProfile, Seed: c.Seed,
	}, os.Stdout)
	if err != nil {
		return err
	}
	res.Print(os.Stdout)
	if c.JSON != "" {
		if err := res.WriteJSON(c.JSON); err != nil {
			return err
		}
		fmt.Printf("results written to %s\n", c.JSON)
	}
	if !res.OK() {
		return errFailed
	}
	return nil
}

type chaosCmd struct {
	PostgresURL string        `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server on which to create the region databases (default: ${default_pg})."`
	Seeds       []uint64      `default:"1" help:"Seeds, comma-separated: each scenario runs once per seed, and a seed replays the same requests."`
	Scenarios   []string      `help:"Scenarios to run, comma-separated, by name or number (default: all built)."`
	Duration    time.Duration `default:"10s" help:"How long each scenario's workload runs."`
	JSON        string        `name:"json" help:"Write the results as JSON to this file." type:"path"`
	Keep        bool          `help:"Keep the region databases afterwards."`
}

func (c *chaosCmd) Run(ctx context.Context) error {
	url := c.PostgresURL
	if url == "" {
		url = pgdb.DefaultURL
	}
	res, err := chaos.Run(ctx, chaos.Config{PostgresURL: url, Seeds: c.Seeds, Scenarios: c.Scenarios, Duration: c.Duration, Keep: c.Keep}, os.Stdout)
	if err != nil && len(res) == 0 {
		return err
	}
	fmt.Println()
	chaos.Print(os.Stdout, res)
	if c.JSON != "" {
		if err := chaos.WriteJSON(c.JSON, res); err != nil {
			return err
		}
		fmt.Printf("results written to %s\n", c.JSON)
	}
	if err != nil {
		return err
	}
	if !chaos.AllPassed(res) {
		return errFailed
	}
	return nil
}

// cliVars are the defaults the flags' help and default tags name.
var cliVars = kong.Vars{"default_pg": pgdb.DefaultURL, "default_batch": fmt.Sprint(ledgerstream.DefaultBatchSize), "default_shards": fmt.Sprint(ledgerstream.DefaultShards)}

func dashboardAddr(flag string) string {
	if flag == "off" {
		return ""
	}
	return flag
}

func main() {
	var c cli
	k := kong.Parse(&c,
		kong.Name("paymesh"),
		kong.Description("A multi-region payment ledger that turns at-least-once messaging into exactly-once effects."),
		cliVars, kong.UsageOnError())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	level := slog.LevelInfo
	if c.Verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	table, err := loadRegions(c.RegionsFile)
	k.FatalIfErrorf(err)
	ids, err := idgen.NewRegions(table.Codes())
	k.FatalIfErrorf(err)
	k.BindTo(ctx, (*context.Context)(nil))
	var procs []sdktrace.SpanProcessor
	if strings.HasPrefix(k.Command(), "demo") && dashboardAddr(c.Demo.Dashboard) != "" {
		// The live page lists the demo's traces: record them in memory.
		c.Demo.traces = dashboard.NewRecorder()
		procs = append(procs, c.Demo.traces)
	}
	shutdown, err := telemetry.SetupTracing(ctx, "paymesh-"+strings.Fields(k.Command())[0], procs...)
	k.FatalIfErrorf(err)
	err = k.Run(table, ids, log)
	_ = shutdown(context.Background())
	if errors.Is(err, errFailed) {
		os.Exit(1)
	}
	k.FatalIfErrorf(err)
}

func loadRegions(path string) (regions.Table, error) {
	if path == "" {
		return regions.Default()
	}
	return regions.Load(path)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
