package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/startup"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/dupexplain"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/regiondb"
)

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
			Dedup: postgres.NewConsumeLog(dedup.New(dedup.Config{WindowDays: c.WindowDays}))}))
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

// clientCmds register API clients and manage their keys in every region.
type clientCmds struct {
	Add    clientCmd       `cmd:"" default:"withargs" help:"Register an API client (or, with --operator, an operator) in every region (or those of --region) and print its API key (the default: paymesh client <id>)."`
	Rotate clientRotateCmd `cmd:"" help:"Give a client a new API key in every region, beside the keys it has, and print it: revoke the old key once the client uses the new one."`
	Revoke clientRevokeCmd `cmd:"" help:"Revoke one of a client's API keys, by its id, in every region."`
	List   clientListCmd   `cmd:"" help:"List a client's API keys (their ids, never the keys) in every region."`
}

// regionStores names the regions' API databases a client command writes.
type regionStores struct {
	PostgresURL string        `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server of the regions' databases (default: ${default_pg})."`
	DBPrefix    string        `name:"database-prefix" env:"PAYMESH_DATABASE_PREFIX" help:"Region databases are named <prefix><region> instead of the region table's."`
	URLs        []string      `name:"postgres-urls" env:"PAYMESH_POSTGRES_URLS" sep:"none" help:"region=URL of each region's Postgres server, when they differ (docker-compose): comma-separated or the flag repeated; a URL may list several hosts (postgres://…@pg-1:5432,pg-2:5432/…)."`
	Regions     []string      `name:"region" help:"Only these regions, comma-separated (default: every region of the region table)."`
	Wait        time.Duration `name:"connect-timeout" env:"PAYMESH_CONNECT_TIMEOUT" default:"60s" help:"How long to wait for a region's API to migrate its tables (docker-compose starts them together)."`
}

type clientCmd struct {
	regionStores
	ID        string `arg:"" help:"Client id (1-64 characters)."`
	Name      string `help:"Display name." default:""`
	Rate      int    `help:"Requests per second allowed." default:"100"`
	Overdraft int64  `name:"max-overdraft" help:"Most overdraft (minor units) the client may give its accounts." default:"0"`
	Operator  bool   `help:"Register an operator instead of a client: its key reaches the operator endpoints (/v1/ops/..., the region's dead letters) and no account or transfer. The id is the operator's name in the dead-letter audit."`
	Key       string `env:"PAYMESH_CLIENT_KEY" help:"Development only (needs --insecure-dev): use this API key instead of a new random one (at least 16 characters)."`
	security
}

func (c *clientCmd) Run(ctx context.Context, t regions.Table, ids *idgen.Regions, log *slog.Logger) error {
	client, err := c.registered()
	if err != nil {
		return err
	}
	key, err := c.apiKey()
	if err != nil {
		return err
	}
	err = c.each(ctx, t, log, func(s regionStore) error { return s.PutClient(ctx, client, key) })
	if err != nil {
		return err
	}
	fmt.Println(key)
	return nil
}

// each runs f on the API store of every region of --region (default: all),
// waiting for a region whose API has not migrated its tables yet.
func (c *regionStores) each(ctx context.Context, t regions.Table, log *slog.Logger, f func(regionStore) error) error {
	names := c.Regions
	if len(names) == 0 {
		for _, r := range t.Regions {
			names = append(names, r.Name)
		}
	}
	stores, err := c.openStores(ctx, t, names)
	defer func() {
		for _, s := range stores {
			s.close()
		}
	}()
	if err != nil {
		return err
	}
	for _, name := range names {
		err := untilMigrated(ctx, name, c.Wait, log, func() error {
			// Not before every migration has run: a table of the first
			// ones may still have a column a later one drops.
			if pending, err := stores[name].Pending(ctx); err != nil || pending {
				return cmp.Or(err, errNotMigrated)
			}
			return f(stores[name])
		})
		if err != nil {
			return fmt.Errorf("region %s: %w", name, err)
		}
	}
	return nil
}

type clientRotateCmd struct {
	regionStores
	ID        string        `arg:"" help:"Client id."`
	ExpiresIn time.Duration `name:"expires-in" help:"The new key stops working this long from now (default: never)."`
}

func (c *clientRotateCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	if c.ExpiresIn < 0 {
		return fmt.Errorf("--expires-in %s: want a positive duration", c.ExpiresIn)
	}
	key, err := newAPIKey()
	if err != nil {
		return err
	}
	var expires time.Time
	if c.ExpiresIn > 0 {
		expires = time.Now().Add(c.ExpiresIn)
	}
	var info api.KeyInfo
	err = c.each(ctx, t, log, func(s regionStore) (err error) {
		info, err = s.AddKey(ctx, c.ID, key, expires)
		return err
	})
	if err != nil {
		return err
	}
	fmt.Printf("%s\t(key id %s)\n", key, info.ID)
	return nil
}

type clientRevokeCmd struct {
	regionStores
	ID    string `arg:"" help:"Client id."`
	KeyID string `arg:"" name:"key-id" help:"The key's id (paymesh client list)."`
}

func (c *clientRevokeCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	return c.each(ctx, t, log, func(s regionStore) error { return s.RevokeKey(ctx, c.ID, c.KeyID) })
}

type clientListCmd struct {
	regionStores
	ID string `arg:"" help:"Client id."`
}

func (c *clientListCmd) Run(ctx context.Context, t regions.Table, log *slog.Logger) error {
	return c.each(ctx, t, log, func(s regionStore) error {
		keys, err := s.Keys(ctx, c.ID)
		if err != nil {
			return err
		}
		for _, k := range keys {
			state := "valid"
			switch {
			case !k.RevokedAt.IsZero():
				state = "revoked " + k.RevokedAt.UTC().Format(time.RFC3339)
			case !k.Valid(time.Now()):
				state = "expired " + k.ExpiresAt.UTC().Format(time.RFC3339)
			case !k.ExpiresAt.IsZero():
				state = "valid until " + k.ExpiresAt.UTC().Format(time.RFC3339)
			}
			fmt.Printf("%s\t%s\t%s\tcreated %s\t%s\n", s.region, c.ID, k.ID, k.CreatedAt.UTC().Format(time.RFC3339), state)
		}
		return nil
	})
}

// registered returns the client or operator the flags describe, or an
// error naming the flag at fault.
func (c *clientCmd) registered() (api.RegisteredClient, error) {
	if err := ledger.ValidClientID(c.ID); err != nil {
		return api.RegisteredClient{}, err
	}
	role := api.RoleClient
	if c.Operator {
		role = api.RoleOperator
		if c.Overdraft != 0 {
			return api.RegisteredClient{}, errors.New("--max-overdraft with --operator: an operator moves no money")
		}
	}
	return api.RegisteredClient{ID: c.ID, Name: c.Name, Role: role, RatePerSec: c.Rate, MaxOverdraft: c.Overdraft}, nil
}

// apiKey returns a new random key, or --key (development only).
func (c *clientCmd) apiKey() (string, error) {
	if c.Key == "" {
		return newAPIKey()
	}
	if !c.InsecureDev {
		return "", errors.New("--key: a key chosen by hand is for development only (--insecure-dev); without it the server makes one")
	}
	if len(c.Key) < 16 {
		return "", fmt.Errorf("--key: an API key needs at least 16 characters")
	}
	return c.Key, nil
}

// newAPIKey returns a new API key: 192 random bits.
func newAPIKey() (string, error) {
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	return "pm_" + hex.EncodeToString(raw), nil
}

// regionStore is a region's API store and the pool it runs on.
type regionStore struct {
	*apidb.Store
	region string
	close  func()
}

// openStores opens the API store of every region of names; the caller
// closes those it returns, also with an error. A missing database
// registers the client nowhere: the error says which ones and what to run.
func (c *regionStores) openStores(ctx context.Context, t regions.Table, names []string) (map[string]regionStore, error) {
	servers := map[string]string{}
	for _, u := range regionURLs(c.URLs) {
		region, url, ok := strings.Cut(u, "=")
		if !ok {
			return nil, fmt.Errorf("--postgres-urls %q: want region=postgres://…", u)
		}
		servers[region] = url
	}
	stores := map[string]regionStore{}
	var missing, found []string
	for _, name := range names {
		one := regionDB{Region: name, PostgresURL: c.PostgresURL}
		if u, ok := servers[name]; ok {
			one.PostgresURL = u
		}
		if c.DBPrefix != "" {
			one.Database = c.DBPrefix + name
		}
		store, err := one.openAPIStore(ctx, t)
		if miss := (*missingDatabase)(nil); errors.As(err, &miss) {
			missing = append(missing, miss.Error())
			continue
		}
		if err != nil {
			return stores, fmt.Errorf("region %s: %w", name, err)
		}
		stores[name] = store
		found = append(found, name)
	}
	if len(missing) > 0 {
		hint := "or register the client only in the regions you run with --region"
		if len(found) > 0 {
			hint += " (--region " + strings.Join(found, ",") + ")"
		}
		return stores, fmt.Errorf("%s;\n%s", strings.Join(missing, ";\n"), hint)
	}
	return stores, nil
}

// regionItem is how an item of a region=URL list starts: a region's name,
// "=" and a URL's scheme. The comma between two hosts of a multi-host URL
// (postgres://…@pg-1:5432,pg-2:5432/…) is followed by a host, and starts
// no item.
var regionItem = regexp.MustCompile(`^[a-z]{2,8}=[a-z][a-z0-9+.-]*://`)

// regionURLs splits the values of --postgres-urls into their region=URL
// items, each value on the commas that start a next item only, so that a
// multi-host URL stays whole.
func regionURLs(values []string) []string {
	var out []string
	for _, v := range values {
		for i, piece := range strings.Split(v, ",") {
			if i > 0 && !regionItem.MatchString(piece) {
				out[len(out)-1] += "," + piece
				continue
			}
			out = append(out, piece)
		}
	}
	return out
}

// missingDatabase is the error of a region whose database does not exist.
type missingDatabase struct{ region, database, migrate string }

func (e *missingDatabase) Error() string {
	return fmt.Sprintf("region %s: database %s does not exist; create it with `%s --create`", e.region, e.database, e.migrate)
}

// openAPIStore connects to the region's database and returns its API
// store. It returns a *missingDatabase when the database does not exist.
func (r regionDB) openAPIStore(ctx context.Context, t regions.Table) (regionStore, error) {
	reg, url, err := r.resolve(t)
	if err != nil {
		return regionStore{}, err
	}
	pool, err := postgres.Connect(ctx, url, time.Minute, 0)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "3D000" { // invalid_catalog_name
		db := cmp.Or(r.Database, reg.Postgres.Database)
		migrate := "paymesh migrate --region " + r.Region
		if r.Database != "" {
			migrate += " --database " + r.Database
		}
		return regionStore{}, &missingDatabase{region: r.Region, database: db, migrate: migrate}
	}
	if err != nil {
		return regionStore{}, err
	}
	return regionStore{Store: apidb.New(pool), region: r.Region, close: pool.Close}, nil
}

// errNotMigrated reports that the API's migrations have not all run yet.
var errNotMigrated = errors.New("the API's migrations have not all run")

// untilMigrated runs f, and again every startup.Every for at most timeout
// while it fails because the region's API migrations have not all run
// (errNotMigrated), or its tables or columns do not exist yet (its API
// migrates them at start, one migration per transaction), logging once
// that it waits. It returns f's last
// error, saying what to run when the tables never came.
func untilMigrated(ctx context.Context, region string, timeout time.Duration, log *slog.Logger, f func() error) error {
	err := startup.Wait(ctx, timeout, log.With("region", region), "waiting for the region's API to migrate its tables", func() error {
		err := f()
		var pgErr *pgconn.PgError
		if err != nil && !errors.Is(err, errNotMigrated) && (!errors.As(err, &pgErr) || (pgErr.Code != "42P01" && pgErr.Code != "42703")) { // undefined_table, undefined_column
			return startup.Permanent(err)
		}
		return err
	})
	if late := (*startup.Timeout)(nil); errors.As(err, &late) {
		return fmt.Errorf("the database is not migrated after %s (start the region's API, or run `paymesh migrate --region %s`): %w", late.After, region, late.Err)
	}
	return err
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
	store := postgres.New(pool, postgres.Config{Region: reg.Name, Dedup: postgres.NewConsumeLog(dedup.New(dedup.Config{WindowDays: c.WindowDays}))})
	if err := regiondb.Migrate(ctx, pool, regiondb.Schema{Ledger: store, API: new(apidb.Migrations()), DeadLetters: true, Webhooks: true}); err != nil {
		return err
	}
	fmt.Printf("region %s: database migrated\n", reg.Name)
	return nil
}

type dupCmd struct {
	Explain dupExplainCmd `cmd:"" help:"Explain a region's recent duplicates: their causes, layers and ages, and a few traces to open, from its Prometheus and Jaeger (no database)."`
}

type dupExplainCmd struct {
	Region     string        `required:"" help:"The region whose duplicates to explain."`
	Since      time.Duration `default:"10m" help:"How far back to look."`
	Prometheus string        `env:"PAYMESH_PROMETHEUS_URL" default:"http://127.0.0.1:9090" help:"Prometheus that scrapes the region's services."`
	Jaeger     string        `env:"PAYMESH_JAEGER_URL" help:"Jaeger's query service (its UI's URL): traces are searched there when Prometheus holds no exemplars, and linked."`
	Traces     int           `default:"5" help:"How many traces to list at most."`
}

func (c *dupExplainCmd) Run(ctx context.Context) error {
	rep, err := dupexplain.Explain(ctx, dupexplain.Config{Prometheus: c.Prometheus, Jaeger: c.Jaeger, Region: c.Region, Since: c.Since, Traces: c.Traces})
	if err != nil {
		return err
	}
	rep.Print(os.Stdout, c.Jaeger)
	return nil
}
