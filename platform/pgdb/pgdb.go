// Package pgdb creates databases, opens pools and applies embedded goose
// migrations. It is shared wiring for the services, the demo and the tests.
package pgdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// DefaultURL is the server the demo and the tests use when nothing else is set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var dbNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// WithDatabase returns base with its database name replaced. It returns an
// error when base is not a postgres:// URL.
func WithDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("pgdb: %q is not a postgres:// URL", base)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// Create creates database name on the server at adminURL and returns its URL.
// With drop set, an existing database of that name is dropped first. It
// returns an error for a name that is not a plain lowercase identifier.
func Create(ctx context.Context, adminURL, name string, drop bool) (string, error) {
	if !dbNameRE.MatchString(name) {
		return "", fmt.Errorf("pgdb: invalid database name %q", name)
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", fmt.Errorf("pgdb: connect %s: %w", Redact(adminURL), err)
	}
	defer conn.Close(ctx)
	if drop {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return "", fmt.Errorf("pgdb: drop %s: %w", name, err)
		}
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pgdb: create %s: %w", name, err)
	}
	return WithDatabase(adminURL, name)
}

// Ensure creates database name on the server at adminURL unless it exists
// (two starting at once: one creates it, the other finds it), and returns
// its URL.
func Ensure(ctx context.Context, adminURL, name string) (string, error) {
	u, err := Create(ctx, adminURL, name, false)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P04" { // duplicate_database
		return WithDatabase(adminURL, name)
	}
	return u, err
}

// Drop drops database name, disconnecting its sessions.
func Drop(ctx context.Context, adminURL, name string) error {
	if !dbNameRE.MatchString(name) {
		return fmt.Errorf("pgdb: invalid database name %q", name)
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("pgdb: connect %s: %w", Redact(adminURL), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgdb: drop %s: %w", name, err)
	}
	return nil
}

// Migration is one embedded, numbered migration set and the table that
// records which of its versions are applied.
type Migration struct {
	FS    fs.FS  // the .sql files, numbered, goose annotated
	Table string // version table, one per set
}

// Migrate applies every set in order, each migration in its own transaction,
// holding a Postgres advisory lock (goose's session locker) while it runs a
// set, so that processes migrating one database at the same time (a
// region's ledgers and APIs at start) take turns. It returns the first
// error, naming the set.
func Migrate(ctx context.Context, pool *pgxpool.Pool, sets ...Migration) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	for _, m := range sets {
		if err := up(ctx, db, m); err != nil {
			return fmt.Errorf("migrate %s: %w", m.Table, err)
		}
	}
	return nil
}

func up(ctx context.Context, db *sql.DB, m Migration) error {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, m.FS,
		goose.WithTableName(m.Table), goose.WithDisableGlobalRegistry(true), goose.WithSessionLocker(locker))
	if err != nil {
		return err
	}
	_, err = p.Up(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		return nil
	}
	return err
}

// Pending reports whether a migration of set m is not applied yet on the
// database, without taking the migration lock, so that a tool waiting for
// another process's migrations never acts on a schema half migrated. A
// database without the set's version table may return its error.
func Pending(ctx context.Context, pool *pgxpool.Pool, m Migration) (bool, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, m.FS, goose.WithTableName(m.Table), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return false, err
	}
	current, target, err := p.GetVersions(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations of %s: %w", m.Table, err)
	}
	return current < target, nil
}

// Redact returns a URL with its password hidden, for messages.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<invalid url>"
	}
	return u.Redacted()
}
