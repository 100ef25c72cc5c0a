package main

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/router/routerd"
)

// TestServicesConnectAsTheirNATSUsers: the router and the API
// connect to a region's server with users (as in docker-compose) as the
// user of --nats-user and make sure of the route stream with its
// permissions; without a user they are refused, and the ledger's user may
// not touch the route stream.
func TestServicesConnectAsTheirNATSUsers(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu")
	f := ledgertest.New(t)
	u, _ := url.Parse(f.URL)
	db := regionDB{Region: "eu", PostgresURL: f.URL, Database: strings.TrimPrefix(u.Path, "/")}
	tab, ids := defaultRegions(t)
	login := func(service string) natsLogin {
		u, err := natsauth.UserOf("eu", service)
		if err != nil {
			t.Fatal(err)
		}
		return natsLogin{NATSUser: u.Name, NATSPassword: u.Password}
	}
	_, url, err := db.resolve(tab)
	if err != nil {
		t.Fatal(err)
	}
	connect := func(l natsLogin, service string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var a interface{ Close() error }
		var err error
		switch service {
		case natsauth.Router:
			a, err = routerd.Open(ctx, routerd.Config{Region: "eu", Regions: ids, PostgresURL: url, NATSURL: topo.ClientURL("eu"),
				NATSUser: l.NATSUser, NATSPassword: l.NATSPassword, AckWait: time.Second})
		default:
			a, err = apid.Open(ctx, apid.Config{Region: "eu", Regions: ids, PostgresURL: url, NATSURL: topo.ClientURL("eu"),
				NATSUser: l.NATSUser, NATSPassword: l.NATSPassword, AckWait: time.Second})
		}
		if err == nil {
			err = a.Close()
		}
		return err
	}
	for _, service := range []string{natsauth.Router, natsauth.API} {
		if err := connect(login(service), service); err != nil {
			t.Errorf("%s as %s: %v", service, login(service).NATSUser, err)
		}
	}
	if err := connect(natsLogin{}, natsauth.API); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("api without a user: %v, want an authorization violation", err)
	}
	if err := connect(login(natsauth.Ledger), natsauth.API); err == nil {
		t.Error("the ledger's user made sure of the route stream")
	}
}
