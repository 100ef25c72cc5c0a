package postgres

import (
	"context"
	"fmt"
)

// Replication is the region's database as the server the ledger writes to
// sees it: which server that is, its timeline, and its standbys.
type Replication struct {
	// Server is the address of the server, host:port as it sees itself
	// (the socket's, "local" over a Unix socket).
	Server string
	// Timeline is the server's WAL timeline: 1 for a database never
	// failed over, one more at each promotion of a standby. Its increase
	// counts the region's failovers.
	Timeline int64
	// Standbys is how many standbys stream from the server; Synchronous
	// how many of them a COMMIT waits for (sync_state sync or quorum).
	Standbys, Synchronous int
	// LagBytes and LagSeconds are the furthest standby's distance behind
	// the server: WAL not yet replayed, and the replay lag the server last
	// measured (0 with no standby).
	LagBytes   int64
	LagSeconds float64
}

// replicationSQL reads Replication in one statement. The timeline is the
// first eight hex digits of the current WAL file's name.
const replicationSQL = `
SELECT coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'local'),
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,
       count(r.pid),
       count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum')),
       coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn)), 0)::bigint,
       coalesce(max(extract(epoch FROM r.replay_lag)), 0)::float8
FROM (SELECT 1) one LEFT JOIN pg_stat_replication r ON true`

// Replication returns the replication state of the server the store's
// pool writes to. Its user needs the pg_monitor role (or to be a
// superuser) to see the standbys' state; it returns an error when the
// query fails.
func (s *Store) Replication(ctx context.Context) (Replication, error) {
	var r Replication
	if err := s.pool.QueryRow(ctx, replicationSQL).Scan(&r.Server, &r.Timeline, &r.Standbys, &r.Synchronous, &r.LagBytes, &r.LagSeconds); err != nil {
		return Replication{}, fmt.Errorf("replication: %w", err)
	}
	return r, nil
}
