package natsembed_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/subjects"
)

// client is a connection as one user that records the permission
// violations the server reports to it.
type client struct {
	name string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

// connectAs connects to region's server as service's user, with the
// user's JetStream domain unless domain names another.
func connectAs(t *testing.T, topo *natsembed.Topology, region, service, domain string) *client {
	t.Helper()
	u, err := natsauth.UserOf(region, service)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, u.Name, topo.ClientURL(region), natsauth.ConnectOptions(u.Name, u.Password)...)
	if domain == "" {
		c.js, err = jetstream.New(c.nc)
	} else {
		c.js, err = jetstream.NewWithDomain(c.nc, domain)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dial connects to url as user name with opts.
func dial(t *testing.T, name, url string, opts ...nats.Option) *client {
	t.Helper()
	c := &client{name: name, errs: make(chan error, 64)}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	}))
	var err error
	if c.nc, err = nats.Connect(url, opts...); err != nil {
		t.Fatalf("connect to %s as %s: %v", url, name, err)
	}
	t.Cleanup(c.nc.Close)
	return c
}

// refused fails the test unless the server reports, within ten seconds, a
// permissions violation of c for op ("Publish" or "Subscription") on
// subject.
func (c *client) refused(t *testing.T, op, subject string) {
	t.Helper()
	want := "Permissions Violation for " + op + ` to "` + subject + `"`
	timeout := time.After(10 * time.Second)
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
				return
			}
		case <-timeout:
			t.Errorf("%s: %s to %s was not refused", c.name, op, subject)
			return
		}
	}
}

// quiet fails the test if c was refused anything.
func (c *client) quiet(t *testing.T) {
	t.Helper()
	select {
	case err := <-c.errs:
		t.Errorf("%s: %v", c.name, err)
	default:
	}
}

// msgs returns the number of messages in a stream, read by c.
func (c *client) msgs(t *testing.T, stream string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("%s: stream %s: %v", c.name, stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("%s: stream %s: %v", c.name, stream, err)
	}
	return info.State.Msgs
}

// TestPermissionsScenario12 is the scenario 12 on the running
// topology with deploy/regions' users: a region's ledger and API cannot put
// anything into another region's ledger stream, neither by a plain publish
// nor through that region's JetStream domain, while its router's forward
// lands; only API users send and receive forwarded API calls; and nothing
// connects without a user, to a region or to the hub.
func TestPermissionsScenario12(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu", "us")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	usLedger := connectAs(t, topo, "us", natsauth.Ledger, "")
	createStream(t, usLedger.js, "LEDGER_US", "ledger.us.>")

	// The router's forward path: eu's router publishes into us's stream.
	euRouter := connectAs(t, topo, "eu", natsauth.Router, "")
	ack := publishEventually(t, euRouter.js, cmdSubject("us", 1, "eu"), "xfer/p/1", 30*time.Second)
	if ack.Stream != "LEDGER_US" || ack.Domain != "us" {
		t.Fatalf("router forward: ack %+v, want LEDGER_US in domain us", ack)
	}
	euRouter.quiet(t)

	for _, service := range []string{natsauth.Ledger, natsauth.API} {
		// A plain JetStream publish, as a router's, to us's subject.
		c := connectAs(t, topo, "eu", service, "")
		if ack, err := publish(c.js, cmdSubject("us", 2, "eu"), "xfer/p/"+service, time.Second); err == nil {
			t.Errorf("%s: publish to %s acked: %+v", c.name, cmdSubject("us", 2, "eu"), ack)
		}
		c.refused(t, "Publish", cmdSubject("us", 2, "eu"))
		// A core publish, without waiting for an ack.
		if err := c.nc.Publish(cmdSubject("us", 3, "eu"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "Publish", cmdSubject("us", 3, "eu"))

		// Through us's JetStream domain: neither us's stream API nor a
		// publish in that domain is open to eu's services.
		d := connectAs(t, topo, "eu", service, "us")
		// The refused request is not answered: it waits out its timeout.
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		_, err := d.js.Stream(sctx, "LEDGER_US")
		scancel()
		if err == nil {
			t.Errorf("%s: stream LEDGER_US through domain us: found", d.name)
		}
		d.refused(t, "Publish", "$JS.us.API.STREAM.INFO.LEDGER_US")
		if ack, err := publish(d.js, cmdSubject("us", 4, "eu"), "xfer/d/"+service, time.Second); err == nil {
			t.Errorf("%s: publish in domain us acked: %+v", d.name, ack)
		}
		d.refused(t, "Publish", cmdSubject("us", 4, "eu"))
	}
	// Nor does the router manage us's streams: it only publishes.
	euRouterUS := connectAs(t, topo, "eu", natsauth.Router, "us")
	if _, err := euRouterUS.nc.Request("$JS.us.API.STREAM.PURGE.LEDGER_US", nil, time.Second); err == nil {
		t.Error("eu's router purged LEDGER_US through domain us")
	}
	euRouterUS.refused(t, "Publish", "$JS.us.API.STREAM.PURGE.LEDGER_US")
	// us's own ledger may not publish into its stream either: only routers do.
	if err := usLedger.nc.Publish(cmdSubject("us", 5, "us"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	usLedger.refused(t, "Publish", cmdSubject("us", 5, "us"))

	// Forwarded API calls: us's API answers eu's.
	usAPI := connectAs(t, topo, "us", natsauth.API, "")
	calls := make(chan string, 16)
	if _, err := usAPI.nc.QueueSubscribe("paymesh.api.us", "api", func(m *nats.Msg) {
		calls <- m.Header.Get("From")
		_ = m.Respond([]byte("ok"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := usAPI.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	euAPI := connectAs(t, topo, "eu", natsauth.API, "")
	var rep *nats.Msg
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m := nats.NewMsg("paymesh.api.us")
		m.Header.Set("From", euAPI.name)
		if rep, err = euAPI.nc.RequestMsg(m, time.Second); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || string(rep.Data) != "ok" {
		t.Fatalf("api-eu -> paymesh.api.us: %v", err)
	}
	if from := <-calls; from != euAPI.name {
		t.Fatalf("forwarded call from %q, want %s", from, euAPI.name)
	}
	euAPI.quiet(t)
	usAPI.quiet(t)
	// No other user sends or receives forwarded calls, nor reads another
	// user's replies; eu's API does not receive us's calls.
	for _, c := range []*client{connectAs(t, topo, "eu", natsauth.Ledger, ""), connectAs(t, topo, "eu", natsauth.Router, "")} {
		m := nats.NewMsg("paymesh.api.us")
		m.Header.Set("From", c.name)
		if err := c.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "Publish", "paymesh.api.us")
		if _, err := c.nc.Subscribe("paymesh.api.eu", func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "Subscription", "paymesh.api.eu")
		if _, err := c.nc.Subscribe("_INBOX.>", func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "Subscription", "_INBOX.>")
	}
	if _, err := euAPI.nc.Subscribe("paymesh.api.us", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	euAPI.refused(t, "Subscription", "paymesh.api.us")
	select {
	case from := <-calls:
		t.Errorf("us's API received a forwarded call from %s", from)
	case <-time.After(200 * time.Millisecond):
	}

	// Without a user nothing connects: not to a region, not to the hub.
	for _, url := range []string{topo.ClientURL("eu"), topo.Hub().ClientURL()} {
		if nc, err := nats.Connect(url); err == nil {
			nc.Close()
			t.Errorf("anonymous connection to %s accepted", url)
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("anonymous connection to %s: %v, want an authorization violation", url, err)
		}
	}
	// The hub's only client user can do nothing.
	hubUser := natsauth.HubUsers()[0]
	hub := dial(t, hubUser.Name, topo.Hub().ClientURL(), nats.UserInfo(hubUser.Name, hubUser.Password))
	if err := hub.nc.Publish(cmdSubject("us", 6, "us"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	hub.refused(t, "Publish", cmdSubject("us", 6, "us"))

	if n := usLedger.msgs(t, "LEDGER_US"); n != 1 {
		t.Errorf("LEDGER_US holds %d messages, want only the router's 1", n)
	}
}

// cmdSubject is a client command's subject of shard in region's ledger
// stream, sent from region from.
func cmdSubject(region string, shard int, from string) string {
	return subjects.LedgerSubject(region, shard, subjects.ClassCommand, from)
}

// TestPermissionsClasses: each class of ledger subject is open only to its
// own publishers. An API sends client commands to its own region's ledger
// and nothing else (no fund, no saga step); a router forwards client
// commands and relays its own region's saga steps to any region, and sends
// no step in another region's name and no fund; only the region's operator
// funds or replays; a ledger sends its own region's saga steps, to any
// region, and no other ledger subject. What is allowed lands in the stream;
// everything else is refused by the server.
func TestPermissionsClasses(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu", "us")
	for _, r := range []string{"eu", "us"} {
		l := connectAs(t, topo, r, natsauth.Ledger, "")
		createStream(t, l.js, subjects.LedgerStream(r), subjects.Ledger(r))
	}
	at := func(region string, class subjects.Class, from string) string {
		return subjects.LedgerSubject(region, 1, class, from)
	}
	cases := []struct {
		service string
		allowed []string
		refused []string
	}{
		{natsauth.API, []string{at("eu", subjects.ClassCommand, "eu")},
			[]string{at("eu", subjects.ClassOps, "eu"), at("eu", subjects.ClassStep, "eu"), at("us", subjects.ClassCommand, "eu"),
				at("eu", subjects.ClassCommand, "us")}},
		{natsauth.Router, []string{at("us", subjects.ClassCommand, "eu"), at("us", subjects.ClassStep, "eu"), at("eu", subjects.ClassStep, "eu")},
			[]string{at("us", subjects.ClassStep, "us"), at("us", subjects.ClassCommand, "us"), at("eu", subjects.ClassOps, "eu"),
				at("us", subjects.ClassOps, "eu")}},
		{natsauth.Ops, []string{at("eu", subjects.ClassOps, "eu")},
			[]string{at("eu", subjects.ClassCommand, "eu"), at("eu", subjects.ClassStep, "eu"), at("us", subjects.ClassOps, "eu"),
				at("us", subjects.ClassOps, "us")}},
		{natsauth.Ledger, []string{at("us", subjects.ClassStep, "eu"), at("eu", subjects.ClassStep, "eu")},
			[]string{at("eu", subjects.ClassCommand, "eu"), at("us", subjects.ClassStep, "us"), at("us", subjects.ClassCommand, "eu"),
				at("eu", subjects.ClassOps, "eu")}},
	}
	want := map[string]uint64{}
	for _, tc := range cases {
		c := connectAs(t, topo, "eu", tc.service, "")
		for i, subject := range tc.allowed {
			ack := publishEventually(t, c.js, subject, tc.service+"/"+string(rune('a'+i)), 30*time.Second)
			want[ack.Stream]++
		}
		c.quiet(t)
		for _, subject := range tc.refused {
			if err := c.nc.Publish(subject, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			c.refused(t, "Publish", subject)
		}
	}
	for _, r := range []string{"eu", "us"} {
		l := connectAs(t, topo, r, natsauth.Ledger, "")
		if got := l.msgs(t, subjects.LedgerStream(r)); got != want[subjects.LedgerStream(r)] {
			t.Errorf("%s holds %d messages, want the %d allowed publishes", subjects.LedgerStream(r), got, want[subjects.LedgerStream(r)])
		}
	}
}

// TestPermissionsAnswers: only a region's ledger tells its APIs which keys
// it answered (paymesh.answers.<r>.<process>), and only that region's API
// users receive the notifications: no other service, and no other region's
// ledger, can publish one, and no other user can subscribe to them.
func TestPermissionsAnswers(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu", "us")
	subject := subjects.Answers("eu", "7")

	euAPI := connectAs(t, topo, "eu", natsauth.API, "")
	got := make(chan string, 16)
	if _, err := euAPI.nc.Subscribe(subjects.AnswersOf("eu"), func(m *nats.Msg) { got <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := euAPI.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	euAPI.quiet(t)

	euLedger := connectAs(t, topo, "eu", natsauth.Ledger, "")
	if err := euLedger.nc.Publish(subject, []byte("from ledger-eu")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m != "from ledger-eu" {
			t.Fatalf("got %q, want the ledger's notification", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("api-eu did not receive ledger-eu's notification")
	}
	euLedger.quiet(t)

	// No other user publishes eu's notifications, here or from us.
	for _, c := range []*client{
		connectAs(t, topo, "eu", natsauth.Router, ""), connectAs(t, topo, "eu", natsauth.API, ""),
		connectAs(t, topo, "eu", natsauth.Ops, ""), connectAs(t, topo, "us", natsauth.Ledger, ""),
	} {
		if err := c.nc.Publish(subject, []byte("from "+c.name)); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "Publish", subject)
	}
	// Nor subscribes to them: not eu's other services, not us's API.
	for _, c := range []*client{
		connectAs(t, topo, "eu", natsauth.Ledger, ""), connectAs(t, topo, "eu", natsauth.Router, ""),
		connectAs(t, topo, "eu", natsauth.Ops, ""), connectAs(t, topo, "us", natsauth.API, ""),
	} {
		if _, err := c.nc.Subscribe(subjects.AnswersOf("eu"), func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		c.refused(t, "Subscription", subjects.AnswersOf("eu"))
	}
	select {
	case m := <-got:
		t.Errorf("api-eu received a forged notification %q", m)
	case <-time.After(200 * time.Millisecond):
	}
}
