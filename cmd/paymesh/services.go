package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/secure"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/router/routerd"
)

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
	NATSCA       string `name:"nats-ca" env:"PAYMESH_NATS_CA" type:"existingfile" help:"PEM file of the authority that signs the nats-servers' certificates: the connection then requires TLS and verifies them with it (docker-compose: /certs/ca.pem)."`
}

// regionNATS is a service's region on NATS: its servers, its user there,
// and how many replicas the streams it creates keep.
type regionNATS struct {
	NATSURL string `name:"nats-url" env:"PAYMESH_NATS_URL" default:"nats://127.0.0.1:4222" help:"NATS servers of the region: one URL, or a comma-separated list (every server of the region's JetStream cluster, so the service survives the loss of one)."`
	natsLogin
	StreamReplicas int   `name:"stream-replicas" env:"PAYMESH_STREAM_REPLICAS" default:"1" help:"Replicas of the streams this service creates or updates (1 to 5; 3 on a region cluster of three servers). An existing stream is scaled to it."`
	StreamMaxMsgs  int64 `name:"stream-max-msgs" env:"PAYMESH_STREAM_MAX_MSGS" default:"4000000" help:"Messages at which the ledger or route stream this service creates refuses publishes (0: the default). Commands stay until consumed, with no age limit."`
	StreamMaxBytes int64 `name:"stream-max-bytes" env:"PAYMESH_STREAM_MAX_BYTES" default:"4294967296" help:"Bytes at which that stream refuses publishes (0: the default); JetStream reserves them, times the replicas, from its max_file_store."`
}

// streams returns --stream-replicas and the stream limits, or an error
// for a replica count outside 1 to ledgerstream.MaxReplicas (0 is refused:
// the flag says what it means) or a limit below 0.
func (r regionNATS) streams() (int, ledgerstream.Limits, error) {
	if err := ledgerstream.CheckReplicas(r.StreamReplicas); err != nil {
		return 0, ledgerstream.Limits{}, fmt.Errorf("--stream-replicas: %w", err)
	}
	l := ledgerstream.Limits{MaxMsgs: r.StreamMaxMsgs, MaxBytes: r.StreamMaxBytes}
	if err := ledgerstream.CheckLimits(l); err != nil {
		return 0, ledgerstream.Limits{}, fmt.Errorf("--stream-max-msgs, --stream-max-bytes: %w", err)
	}
	return r.StreamReplicas, l, nil
}

// dependencyWait bounds how long a service waits at start for its Postgres
// and nats-server (docker-compose starts them together).
type dependencyWait struct {
	ConnectTimeout time.Duration `name:"connect-timeout" env:"PAYMESH_CONNECT_TIMEOUT" default:"60s" help:"How long to wait at start for Postgres and NATS to answer."`
}

// security is how a service treats insecure settings (platform/secure):
// it refuses them, or with --insecure-dev logs each as a warning.
type security struct {
	InsecureDev bool `name:"insecure-dev" env:"PAYMESH_INSECURE_DEV" help:"Development only: start with insecure settings (NATS without a user or with a published development password, NATS without TLS to a server other hosts can reach, Postgres without TLS or with a published development password, plain HTTP on a public address), logging each as a warning. Without it the service refuses to start with them."`
}

// guard returns an error naming what is insecure in s, unless there is
// nothing or --insecure-dev is set (then each is logged as a warning).
func (c security) guard(s secure.Settings, log *slog.Logger) error {
	found := secure.Check(s)
	if len(found) == 0 {
		return nil
	}
	if !c.InsecureDev {
		return fmt.Errorf("refusing to start with insecure settings (--insecure-dev starts anyway, for development only): %s",
			strings.Join(found, "; "))
	}
	for _, f := range found {
		log.Warn("insecure setting, allowed by --insecure-dev: development only", "setting", f)
	}
	return nil
}

// logins is the login of a service's NATS connection, for guard.
func (l natsLogin) logins() []secure.Login {
	return []secure.Login{{Flag: "--nats-user", User: l.NATSUser, Password: l.NATSPassword}}
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
	MaxDeliver int           `name:"max-deliver" env:"PAYMESH_MAX_DELIVER" default:"10" help:"Deliveries before a client request whose apply keeps failing is dead-lettered."`
	// MaxStepDeliver and MaxParkedDeliver: see ledgerstream.ConsumerConfig.
	MaxStepDeliver   int           `name:"max-step-deliver" env:"PAYMESH_MAX_STEP_DELIVER" default:"100" help:"Deliveries before a saga step whose apply keeps failing is dead-lettered (step_max_deliveries; 0: the default)."`
	MaxParkedDeliver int           `name:"max-parked-deliver" env:"PAYMESH_MAX_PARKED_DELIVER" default:"1000" help:"Deliveries before a saga step still ahead of its state is dead-lettered (step_parked; 0: the default)."`
	DLQMaxMsgs       int64         `name:"dlq-max-msgs" env:"PAYMESH_DLQ_MAX_MSGS" default:"100000" help:"Dead letters at which the region's dead-letter stream refuses more (0: the default); a refused one stays in the ledger stream."`
	DLQMaxBytes      int64         `name:"dlq-max-bytes" env:"PAYMESH_DLQ_MAX_BYTES" default:"268435456" help:"Bytes at which the dead-letter stream refuses more (0: the default)."`
	Lease            time.Duration `env:"PAYMESH_LEASE" default:"30s" help:"Longest a transaction may sit idle before Postgres ends it and its claims pass on."`
	WindowDays       int           `name:"dedup-window-days" env:"PAYMESH_DEDUP_WINDOW_DAYS" default:"7" help:"Days of consume-log kept."`
	CacheSize        int           `name:"cache-size" env:"PAYMESH_CACHE_SIZE" default:"100000" help:"Recently committed keys kept in memory (0 disables)."`
	Shards           int           `env:"PAYMESH_SHARDS" default:"16" help:"Ledger subjects per region."`
	OutboxKeep       time.Duration `name:"outbox-retention" env:"PAYMESH_OUTBOX_RETENTION" default:"24h" help:"How long sent outbox rows are kept before they are deleted (negative keeps them all)."`
	EventKeep        time.Duration `name:"event-retention" env:"PAYMESH_EVENT_RETENTION" default:"720h" help:"How long events are kept for the feed (GET /v1/events) before they are deleted (negative keeps them all)."`
	noEvents
	SyncStandbys int    `name:"postgres-standbys" env:"PAYMESH_POSTGRES_STANDBYS" default:"0" help:"Synchronous standbys the region's database is meant to have (0: a single server): exported as paymesh_postgres_standbys_expected, and alerted on while fewer stream from the primary."`
	ShardSet     string `name:"shard-set" env:"PAYMESH_SHARD_SET" default:"0/1" help:"i/n: this process applies the shards k with k mod n = i. Give each ledger replica of a region its own i."`
	RelaySteps   bool   `name:"relay-steps" env:"PAYMESH_RELAY_STEPS" help:"Leave every saga step to the router's relay instead of publishing it right after the commit (for a ledger NATS user without the right to publish steps)."`
	Metrics      string `name:"metrics-listen" env:"PAYMESH_METRICS_LISTEN" help:"Address of /metrics (default: 127.0.0.1:<the region's metrics_port>; 'off' for none)."`
	dependencyWait
	security
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
	replicas, limits, err := c.streams()
	if err != nil {
		return err
	}
	dlq := ledgerstream.Limits{MaxMsgs: c.DLQMaxMsgs, MaxBytes: c.DLQMaxBytes}
	if err := ledgerstream.CheckLimits(dlq); err != nil {
		return fmt.Errorf("--dlq-max-msgs, --dlq-max-bytes: %w", err)
	}
	if c.SyncStandbys < 0 {
		return fmt.Errorf("--postgres-standbys %d: want 0 (a single server) or more", c.SyncStandbys)
	}
	if c.MaxStepDeliver < 0 || c.MaxParkedDeliver < 0 {
		return fmt.Errorf("--max-step-deliver %d, --max-parked-deliver %d: want 0 (the default) or more", c.MaxStepDeliver, c.MaxParkedDeliver)
	}
	if err := c.guard(secure.Settings{NATS: c.logins(), NATSURL: c.NATSURL, NATSCA: c.NATSCA, PostgresURL: url}, log); err != nil {
		return err
	}
	srv, err := ledgerd.Open(ctx, ledgerd.Config{OwnShards: own, StreamReplicas: replicas, StreamLimits: limits, DLQLimits: dlq,
		MaxStepDeliver: c.MaxStepDeliver, MaxParkedDeliver: c.MaxParkedDeliver, RelaySteps: c.RelaySteps,
		Region: reg.Name, Regions: ids, Node: c.Node, PostgresURL: url, NATSURL: c.NATSURL, NATSUser: c.NATSUser, NATSPassword: c.NATSPassword, NATSCA: c.NATSCA, Workers: c.Workers,
		BatchSize: c.BatchSize, AckWait: c.AckWait, MaxDeliver: c.MaxDeliver, Lease: c.Lease,
		WindowDays: c.WindowDays, OutboxRetention: c.OutboxKeep, EventRetention: c.EventKeep, NoEvents: c.NoEvents, SyncStandbys: c.SyncStandbys, CacheSize: c.CacheSize, Shards: c.Shards, Log: log.With("service", "ledger"),
		Answers: apidb.Answers{}, AnswersSchema: new(apidb.Migrations()),
		MetricsListen: metricsListen(c.Metrics, reg.MetricsPort), ConnectTimeout: c.ConnectTimeout,
	})
	if err != nil {
		return err
	}
	return run(ctx, srv)
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
	noEvents
	NoWebhooks        bool     `name:"no-webhooks" env:"PAYMESH_NO_WEBHOOKS" help:"Serve no webhook endpoints (503) and deliver no events."`
	WebhookAllowHosts []string `name:"webhook-allow-hosts" env:"PAYMESH_WEBHOOK_ALLOW_HOSTS" help:"Hosts a webhook endpoint may name though they are not public addresses (loopback, private networks), comma-separated: your own receivers. Plain http is allowed to them alone."`
	TLSUpstream       bool     `name:"tls-upstream" env:"PAYMESH_TLS_UPSTREAM" help:"TLS ends in front of --listen (a proxy or load balancer): plain HTTP on a public address is then no exposure."`
	dependencyWait
	security
}

// noEvents is the setting that turns the events off; a region's ledgers
// and APIs must agree on it.
type noEvents struct {
	NoEvents bool `name:"no-events" env:"PAYMESH_NO_EVENTS" help:"Record no events: the feed (GET /v1/events) stays empty. Give the region's ledgers and APIs the same setting."`
}

func (c *apiCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions, log *slog.Logger) error {
	reg, url, err := c.resolve(t)
	if err != nil {
		return err
	}
	replicas, limits, err := c.streams()
	if err != nil {
		return err
	}
	listen := c.Listen
	if listen == "" {
		listen = fmt.Sprintf("127.0.0.1:%d", reg.APIPort)
	}
	logins := c.logins()
	if c.OpsNATSUser != "" {
		logins = append(logins, secure.Login{Flag: "--ops-nats-user", User: c.OpsNATSUser, Password: c.OpsNATSPassword})
	}
	if err := c.guard(secure.Settings{NATS: logins, NATSURL: c.NATSURL, NATSCA: c.NATSCA, PostgresURL: url, HTTPListen: listen, TLSUpstream: c.TLSUpstream}, log); err != nil {
		return err
	}
	srv, err := apid.Open(ctx, apid.Config{StreamReplicas: replicas, StreamLimits: limits, Region: reg.Name, Regions: ids, Node: c.Node, PostgresURL: url,
		NATSURL: c.NATSURL, NATSUser: c.NATSUser, NATSPassword: c.NATSPassword, NATSCA: c.NATSCA, OpsNATSUser: c.OpsNATSUser, OpsNATSPassword: c.OpsNATSPassword,
		Shards: c.Shards, Wait: c.Wait, KeyTTL: c.KeyTTL, ClientCacheTTL: cmp.Or(c.ClientCacheTTL, -1), ClaimKeys: c.ClaimKeys, SubmitAll: c.SubmitAll, NoEvents: c.NoEvents,
		NoWebhooks: c.NoWebhooks, WebhookAllowHosts: c.WebhookAllowHosts, Listen: listen, MetricsListen: metricsListen(c.Metrics, reg.APIMetricsPort), ConnectTimeout: c.ConnectTimeout,
		Log: log.With("service", "api")})
	if err != nil {
		return err
	}
	return run(ctx, srv)
}

type routerCmd struct {
	regionDB
	regionNATS
	Shards  int           `env:"PAYMESH_SHARDS" default:"16" help:"Ledger subjects per region (as the ledgers)."`
	AckWait time.Duration `name:"ack-wait" env:"PAYMESH_ROUTER_ACK_WAIT" default:"10s" help:"How long a forward may take before it is retried."`
	Metrics string        `name:"metrics-listen" env:"PAYMESH_ROUTER_METRICS_LISTEN" help:"Address of /metrics (default: 127.0.0.1:<the region's router_metrics_port>; 'off' for none)."`
	dependencyWait
	security
}

func (c *routerCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions, log *slog.Logger) error {
	reg, url, err := c.resolve(t)
	if err != nil {
		return err
	}
	replicas, limits, err := c.streams()
	if err != nil {
		return err
	}
	if err := c.guard(secure.Settings{NATS: c.logins(), NATSURL: c.NATSURL, NATSCA: c.NATSCA, PostgresURL: url}, log); err != nil {
		return err
	}
	srv, err := routerd.Open(ctx, routerd.Config{StreamReplicas: replicas, StreamLimits: limits, Region: reg.Name, Regions: ids, PostgresURL: url,
		NATSURL: c.NATSURL, NATSUser: c.NATSUser, NATSPassword: c.NATSPassword, NATSCA: c.NATSCA, Shards: c.Shards, AckWait: c.AckWait,
		MetricsListen: metricsListen(c.Metrics, reg.RouterMetricsPort), ConnectTimeout: c.ConnectTimeout, Log: log})
	if err != nil {
		return err
	}
	return run(ctx, srv)
}
