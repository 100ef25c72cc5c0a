package api

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
)

// A panic while serving a request or a forwarded call must not take the
// process down with the calls it serves, nor leave the caller without an
// answer: it is recovered where each is served, logged with its stack,
// counted, and answered with the internal-error problem (the caller learns
// nothing of the internals). net/http recovers a handler's panic by
// itself, but only closes the connection; the goroutine that serves a
// forwarded call has nothing above it.

// PanicSite is where a panic was recovered: a small closed set, the label
// of the panics metric.
type PanicSite uint8

// The places a panic is recovered.
const (
	// PanicHTTP is an HTTP request (Handler.ServeHTTP).
	PanicHTTP PanicSite = iota
	// PanicForwarded is a call forwarded from another region
	// (forwarder.listen).
	PanicForwarded
	numPanicSites
)

// PanicSites lists every panic site.
var PanicSites = []PanicSite{PanicHTTP, PanicForwarded}

// String returns the site's label value.
func (p PanicSite) String() string {
	if p >= numPanicSites {
		return "unknown"
	}
	return [...]string{"http", "forwarded"}[p]
}

// errPanicked is what a recovered panic is answered with: an error without
// a code, rendered as the generic internal-error problem.
var errPanicked = errors.New("panic while serving")

// recovered answers the panic p, recovered at site: it logs it with its
// stack and counts it.
func recovered(log *slog.Logger, st *Stats, site PanicSite, p any, attrs ...any) reply {
	st.panics[site].Add(1)
	log.Error("panic recovered", append([]any{"site", site.String(), "panic", fmt.Sprint(p), "stack", string(debug.Stack())}, attrs...)...)
	return errReply(errPanicked)
}

// ServeHTTP serves the API. A panic in a handler is answered 500 with the
// internal-error problem; http.ErrAbortHandler, a handler's own way to
// abort its response, passes through to net/http.
func (s *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			write(w, recovered(s.cfg.Log, &s.Stats, PanicHTTP, p, "method", r.Method, "path", r.URL.Path))
		}
	}()
	s.mux.ServeHTTP(w, r)
}
