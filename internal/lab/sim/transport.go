package sim

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/deploy/regions"
)

// Transport is what the run saw of its links' encryption, read from the
// servers themselves once the load has drained: each nats-server's
// monitor port and each Postgres's statistics views.
type Transport struct {
	NATS     []NATSTransport
	Postgres []PostgresTransport
}

// NATSTransport is one nats-server's links.
type NATSTransport struct {
	Server string
	// ClientTLS, RouteTLS and LeafTLS say whether the server requires TLS
	// of its clients, on its cluster routes and of the leafnodes it
	// accepts (/varz tls_required); Routes and Leafnodes say whether it
	// has a cluster port and a leafnode port at all.
	ClientTLS, RouteTLS, LeafTLS bool
	Routes, Leafnodes            bool
	// RouteConns and LeafConns count its routes (/routez) and its
	// leafnode connections (/leafz), which run on TLS when it requires
	// TLS of them (the server refuses a plain one).
	RouteConns, LeafConns int
	// Conns counts its client connections (/connz), and Plain names
	// those without TLS.
	Conns int
	Plain []string
	// TLSVersions counts the client connections by TLS version.
	TLSVersions map[string]int
}

// PostgresTransport is one region's Postgres: its connections from
// other processes and the rules they were let in by.
type PostgresTransport struct {
	Region string
	// Conns counts the client backends connected over the network
	// (pg_stat_activity with a client address), and Plain names those
	// without TLS (pg_stat_ssl), by application and address.
	Conns int
	Plain []string
	// Rules are the hba rules in force (pg_hba_file_rules), "type
	// method" each; Loose those that let a network connection in without
	// TLS or without a scram-sha-256 password.
	Rules, Loose []string
	// SCRAM says the role the services log in as stores a scram-sha-256
	// verifier, not an md5 hash or nothing.
	SCRAM bool
}

// varz is the part of nats-server's /varz the transport check reads.
type varz struct {
	ServerName  string `json:"server_name"`
	TLSRequired bool   `json:"tls_required"`
	Cluster     struct {
		Name        string `json:"name"`
		Port        int    `json:"cluster_port"`
		TLSRequired bool   `json:"tls_required"`
	} `json:"cluster"`
	Leaf struct {
		Port        int  `json:"port"`
		TLSRequired bool `json:"tls_required"`
	} `json:"leaf"`
}

// connz is the part of /connz the transport check reads.
type connz struct {
	Conns []struct {
		Name       string `json:"name"`
		IP         string `json:"ip"`
		Port       int    `json:"port"`
		User       string `json:"authorized_user"`
		TLSVersion string `json:"tls_version"`
	} `json:"connections"`
}

// natsTransport reads one nats-server's links from its monitor port
// (base: http://host:port).
func natsTransport(ctx context.Context, server, base string) (NATSTransport, error) {
	t := NATSTransport{Server: server, TLSVersions: map[string]int{}}
	var v varz
	if err := getJSON(ctx, base+"/varz", &v); err != nil {
		return t, fmt.Errorf("%s: %w", server, err)
	}
	t.ClientTLS = v.TLSRequired
	t.Routes, t.RouteTLS = v.Cluster.Name != "" || v.Cluster.Port != 0, v.Cluster.TLSRequired
	t.Leafnodes, t.LeafTLS = v.Leaf.Port != 0, v.Leaf.TLSRequired
	var c connz
	if err := getJSON(ctx, base+"/connz?auth=true&limit=100000", &c); err != nil {
		return t, fmt.Errorf("%s: %w", server, err)
	}
	var rz struct {
		N int `json:"num_routes"`
	}
	if err := getJSON(ctx, base+"/routez", &rz); err != nil {
		return t, fmt.Errorf("%s: %w", server, err)
	}
	var lz struct {
		N int `json:"leafnodes"`
	}
	if err := getJSON(ctx, base+"/leafz", &lz); err != nil {
		return t, fmt.Errorf("%s: %w", server, err)
	}
	t.RouteConns, t.LeafConns = rz.N, lz.N
	for _, conn := range c.Conns {
		t.Conns++
		if conn.TLSVersion == "" {
			t.Plain = append(t.Plain, fmt.Sprintf("%s (user %s, %s:%d)", or(conn.Name, "unnamed"), or(conn.User, "none"), conn.IP, conn.Port))
			continue
		}
		t.TLSVersions[conn.TLSVersion]++
	}
	return t, nil
}

// postgresTransport reads a Postgres server's network connections, hba
// rules and password storage through pool, as its superuser.
func postgresTransport(ctx context.Context, region string, pool *pgxpool.Pool) (PostgresTransport, error) {
	t := PostgresTransport{Region: region}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `
		SELECT coalesce(nullif(a.application_name, ''), 'unnamed') || ' (' || host(a.client_addr) || ':' || a.client_port || ')', coalesce(s.ssl, false)
		FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s USING (pid)
		WHERE a.backend_type IN ('client backend', 'walsender') AND a.client_addr IS NOT NULL`)
	if err != nil {
		return t, fmt.Errorf("postgres %s: connections: %w", region, err)
	}
	for rows.Next() {
		var who string
		var ssl bool
		if err := rows.Scan(&who, &ssl); err != nil {
			rows.Close()
			return t, fmt.Errorf("postgres %s: connections: %w", region, err)
		}
		t.Conns++
		if !ssl {
			t.Plain = append(t.Plain, who)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return t, fmt.Errorf("postgres %s: connections: %w", region, err)
	}
	rows, err = pool.Query(ctx, `SELECT type, coalesce(auth_method, ''), coalesce(error, '') FROM pg_hba_file_rules ORDER BY line_number`)
	if err != nil {
		return t, fmt.Errorf("postgres %s: hba rules: %w", region, err)
	}
	for rows.Next() {
		var typ, method, ruleErr string
		if err := rows.Scan(&typ, &method, &ruleErr); err != nil {
			rows.Close()
			return t, fmt.Errorf("postgres %s: hba rules: %w", region, err)
		}
		rule := typ + " " + method
		t.Rules = append(t.Rules, rule)
		switch {
		case ruleErr != "":
			t.Loose = append(t.Loose, rule+" ("+ruleErr+")")
		case typ == "local": // the server's own socket, not the network
		case typ != "hostssl" || method != "scram-sha-256":
			t.Loose = append(t.Loose, rule)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return t, fmt.Errorf("postgres %s: hba rules: %w", region, err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(rolpassword LIKE 'SCRAM-SHA-256$%', false) FROM pg_authid WHERE rolname = current_user`).Scan(&t.SCRAM); err != nil {
		return t, fmt.Errorf("postgres %s: password: %w", region, err)
	}
	return t, nil
}

// transport reads the links of every nats-server and every region's
// Postgres of the run.
func (s *sim) transport(ctx context.Context) (Transport, error) {
	var t Transport
	for _, name := range s.plan.of(kindNATS) {
		base, err := s.monitorURL(name)
		if err != nil {
			return t, err
		}
		n, err := natsTransport(ctx, name, base)
		if err != nil {
			return t, fmt.Errorf("sim: transport: %w", err)
		}
		t.NATS = append(t.NATS, n)
	}
	for _, r := range s.table.Regions {
		p, err := postgresTransport(ctx, r.Name, s.stores[r.Name].Pool())
		if err != nil {
			return t, fmt.Errorf("sim: transport: %w", err)
		}
		t.Postgres = append(t.Postgres, p)
		servers, err := s.formationServers(ctx, r)
		if err != nil {
			return t, fmt.Errorf("sim: transport: %w", err)
		}
		t.Postgres = append(t.Postgres, servers...)
	}
	return t, nil
}

// formationServers reads the links of each server of a region's
// formation on its own, its standbys' and monitor's too (the region's
// own entry reads only whichever takes writes): the keepers' connections
// to the monitor, the monitor's probes, the standbys' streams.
func (s *sim) formationServers(ctx context.Context, r regions.Region) ([]PostgresTransport, error) {
	if s.plan.kinds[r.PostgresMonitorName()] != kindFormation {
		return nil, nil
	}
	base, err := s.regionDB(r)
	if err != nil {
		return nil, err
	}
	var out []PostgresTransport
	for _, name := range append(r.PostgresNodeNames(), r.PostgresMonitorName()) {
		port, _ := s.plan.project.Services[name].Published(5432)
		u, err := url.Parse(base)
		if err != nil {
			return nil, err
		}
		q := u.Query()
		q.Del("target_session_attrs")
		u.Host, u.Path, u.RawQuery = fmt.Sprintf("127.0.0.1:%d", port), "/postgres", q.Encode()
		pool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			return nil, err
		}
		p, err := postgresTransport(ctx, r.Name+" "+name, pool)
		pool.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// problems lists each link the run saw without TLS or a password, or
// with a server that does not require them; none when every link is
// encrypted and authenticated. A run that saw no server, or no
// connection at all, is a problem too: it checked nothing.
func (t Transport) problems() []string {
	var out []string
	conns := 0
	for _, n := range t.NATS {
		if !n.ClientTLS {
			out = append(out, n.Server+": does not require TLS of its clients")
		}
		if n.Routes && !n.RouteTLS {
			out = append(out, n.Server+": cluster routes without TLS")
		}
		if n.Leafnodes && !n.LeafTLS {
			out = append(out, n.Server+": accepts leafnodes without TLS")
		}
		for _, p := range n.Plain {
			out = append(out, n.Server+": a client connected without TLS: "+p)
		}
		conns += n.Conns
	}
	if len(t.NATS) == 0 || conns == 0 {
		out = append(out, "no nats-server client connection was seen")
	}
	conns = 0
	for _, p := range t.Postgres {
		for _, c := range p.Plain {
			out = append(out, "postgres "+p.Region+": a connection without TLS: "+c)
		}
		for _, r := range p.Loose {
			out = append(out, "postgres "+p.Region+": hba rule "+r+" lets a network connection in without TLS and scram-sha-256")
		}
		if !p.SCRAM {
			out = append(out, "postgres "+p.Region+": the services' role stores no scram-sha-256 verifier")
		}
		conns += p.Conns
	}
	if len(t.Postgres) == 0 || conns == 0 {
		out = append(out, "no Postgres network connection was seen")
	}
	return out
}

// String summarises the links in two lines.
func (t Transport) String() string {
	var servers, routes, leaf, conns, routeConns, leafConns int
	versions := map[string]int{}
	for _, n := range t.NATS {
		if n.ClientTLS {
			servers++
		}
		if n.Routes && n.RouteTLS {
			routes++
		}
		if n.Leafnodes && n.LeafTLS {
			leaf++
		}
		conns += n.Conns
		routeConns += n.RouteConns
		leafConns += n.LeafConns
		for v, c := range n.TLSVersions {
			versions[v] += c
		}
	}
	var vs []string
	for _, v := range slices.Sorted(maps.Keys(versions)) {
		vs = append(vs, fmt.Sprintf("%d %s", versions[v], v))
	}
	var pgConns, pgPlain, loose, scram int
	var regions []string
	for _, p := range t.Postgres {
		pgConns += p.Conns
		pgPlain += len(p.Plain)
		loose += len(p.Loose)
		if p.SCRAM {
			scram++
		}
		regions = append(regions, p.Region)
	}
	return fmt.Sprintf("NATS: %d of %d servers require TLS of clients, %d on cluster routes (%d route connections), %d of leafnodes (%d leafnode connections, both ends counted); %d client connections (TLS %s)\n"+
		"Postgres (%s): %d network connections, %d without TLS; %d hba rules that let one in without TLS and scram-sha-256; %d of %d store a scram-sha-256 password",
		servers, len(t.NATS), routes, routeConns, leaf, leafConns, conns, or(strings.Join(vs, ", "), "none"),
		strings.Join(regions, ", "), pgConns, pgPlain, loose, scram, len(t.Postgres))
}
