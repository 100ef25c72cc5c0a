package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"code.dny.dev/ssrf"

	"github.com/paymesh/paymesh/services/ledger"
)

// Guard keeps deliveries away from the network paymesh runs in (OWASP
// API7, server-side request forgery): an endpoint whose host resolves to
// a loopback, private, link-local, metadata or other special-purpose
// address (code.dny.dev/ssrf's IANA lists) is refused when it is created,
// and every delivery's connection is checked again as it is dialled, after
// resolution, so a name that points elsewhere later is refused then too.
// The hosts an operator names (AllowHosts) are exempt: a receiver on the
// operator's own network, or on loopback in the demo and the simulation.
// Redirects are never followed, and no proxy from the environment is used.
type Guard struct {
	allow    []string
	guardian *ssrf.Guardian
	resolver *net.Resolver
}

// NewGuard returns a guard that lets through the hosts of allow (names or
// addresses, as they appear in an endpoint's URL, matched without case).
func NewGuard(allow []string) *Guard {
	g := &Guard{guardian: ssrf.New(ssrf.WithAnyPort()), resolver: net.DefaultResolver}
	for _, h := range allow {
		if h = strings.TrimSpace(h); h != "" {
			g.allow = append(g.allow, strings.ToLower(strings.Trim(h, "[]")))
		}
	}
	return g
}

// Allowed reports whether the operator allowed host.
func (g *Guard) Allowed(host string) bool {
	return slices.Contains(g.allow, strings.ToLower(strings.Trim(host, "[]")))
}

// ErrUnsafe marks a URL whose host may not be delivered to.
var ErrUnsafe = errors.New("webhooks: the host is not a public address")

// Check refuses an endpoint URL the guard would not deliver to: a host
// that does not resolve, or that resolves to an address that is not
// public, unless the operator allowed it.
func (g *Guard) Check(ctx context.Context, u *url.URL) error {
	host := u.Hostname()
	if g.Allowed(host) {
		return nil
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if addrs, err = g.resolver.LookupNetIP(ctx, "ip", host); err != nil {
			return ledger.Errorf(ledger.CodeInvalidRequest, "url host %.80q does not resolve: %v", host, err)
		}
	}
	for _, a := range addrs {
		if err := g.guardian.SafeAddr(a.Unmap()); err != nil {
			return ledger.Errorf(ledger.CodeInvalidRequest, "url host %.80q resolves to %s, which is not a public address: deliveries go to the internet only", host, a)
		}
	}
	return nil
}

// Client returns the HTTP client deliveries are sent with: each attempt
// bounded by timeout, each connection dialled through the guard unless its
// host is allowed, no redirect followed (a 3xx is an answer, not a 2xx),
// no proxy.
func (g *Guard) Client(timeout time.Duration) *http.Client {
	guarded := &net.Dialer{Timeout: timeout, Control: g.guardian.Safe}
	open := &net.Dialer{Timeout: timeout}
	t := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if g.Allowed(host) {
				return open.DialContext(ctx, network, addr)
			}
			conn, err := guarded.DialContext(ctx, network, addr)
			if err != nil && errors.Is(err, ssrf.ErrProhibitedIP) {
				return nil, fmt.Errorf("%w: %v", ErrUnsafe, err)
			}
			return conn, err
		},
		TLSHandshakeTimeout: timeout,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	return &http.Client{Transport: t, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
