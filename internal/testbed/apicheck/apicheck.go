// Package apicheck holds the API's answers to its OpenAPI document in tests.
// Transport and Client wrap the HTTP client a test calls the API with, and
// fail the test on any response the document does not describe: an
// undocumented status or content type, a body that does not match the
// schema (a missing required field, a field the schema does not name, a
// value out of its enum), or a declared header of the wrong form. Requests
// are not validated: the tests send malformed ones on purpose.
//
// The document is services/api's embedded copy (api.OpenAPI), the one the
// API serves, checked with kin-openapi under JSON Schema 2020-12 (OpenAPI
// 3.1). The check is stricter than the published document in one way: an
// object schema that lists its properties admits no others, so a renamed or
// undocumented field fails here while clients stay free to ignore new fields.
package apicheck

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/paymesh/paymesh/services/api"
)

// Client returns an HTTP client whose transport is Transport(tb, nil).
func Client(tb testing.TB) *http.Client {
	return &http.Client{Transport: Transport(tb, nil)}
}

// Transport returns a RoundTripper that sends each request with base
// (http.DefaultTransport when nil) and checks its response with Check,
// reporting a violation with tb.Errorf. The response reaches the caller
// unchanged. It calls tb.Fatal if the document cannot be loaded.
func Transport(tb testing.TB, base http.RoundTripper) http.RoundTripper {
	tb.Helper()
	if _, err := load(); err != nil {
		tb.Fatalf("apicheck: %v", err)
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{tb: tb, base: base}
}

type transport struct {
	tb   testing.TB
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.base.RoundTrip(req)
	if err != nil {
		return res, err
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return nil, err // the answer was cut short: a network error to the caller
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	if err := Check(req, res.StatusCode, res.Header, body); err != nil {
		t.tb.Errorf("apicheck: %v", err)
	}
	return res, nil
}

// Check validates one answer to req against the document. It returns an
// error naming the operation, the status and the validator's message when
// the answer violates the document, or when no operation matches req.
func Check(req *http.Request, status int, header http.Header, body []byte) error {
	s, err := load()
	if err != nil {
		return err
	}
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		return fmt.Errorf("%s %s answered %d: no operation in openapi.yaml (%v)", req.Method, req.URL.Path, status, err)
	}
	op := fmt.Sprintf("%s (%s %s)", route.Operation.OperationID, route.Method, route.Path)
	if r := route.Operation.Responses.Status(status); r != nil && r.Value != nil && len(r.Value.Content) == 0 && len(body) > 0 {
		return fmt.Errorf("%s answered %d: a %d-byte body (Content-Type %q) where the document declares none",
			op, status, len(body), header.Get("Content-Type"))
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		if len(body) > 512 {
			body = append(body[:512:512], "..."...)
		}
		return fmt.Errorf("%s answered %d %s: %s", op, status, body, brief(err))
	}
	return nil
}

// brief is the validator's message without the schema and value it
// prints after each violation.
func brief(err error) string {
	var b strings.Builder
	skip := false
	for line := range strings.SplitSeq(err.Error(), "\n") {
		switch {
		case line == "Schema:":
			skip = true
		case strings.HasPrefix(line, " | "): // the next violation
			skip = false
		}
		if !skip {
			b.WriteString(line)
		}
	}
	return b.String()
}

type spec struct {
	router routers.Router
}

var (
	loadOnce   sync.Once
	loaded     *spec
	loadFailed error
)

// load parses the document once per test binary.
func load() (*spec, error) {
	loadOnce.Do(func() {
		loaded, loadFailed = parse(api.OpenAPI)
	})
	return loaded, loadFailed
}

func parse(doc []byte) (*spec, error) {
	t, err := openapi3.NewLoader().LoadFromData(doc)
	if err != nil {
		return nil, fmt.Errorf("load services/api/openapi.yaml: %w", err)
	}
	// The servers list the deployed addresses; tests run on random ports.
	t.Servers = nil
	closeObjects(t)
	r, err := legacy.NewRouter(t)
	if err != nil {
		return nil, fmt.Errorf("services/api/openapi.yaml: %w", err)
	}
	return &spec{router: r}, nil
}

// closeObjects makes every object schema of the document that lists its
// properties, and says nothing of others, refuse properties it does not list.
func closeObjects(t *openapi3.T) {
	seen := map[*openapi3.Schema]bool{}
	var walk func(*openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if len(s.Properties) > 0 && s.AdditionalProperties.Has == nil && s.AdditionalProperties.Schema == nil {
			no := false
			s.AdditionalProperties.Has = &no
		}
		for _, p := range s.Properties {
			walk(p)
		}
		walk(s.Items)
		for _, l := range []openapi3.SchemaRefs{s.AllOf, s.AnyOf, s.OneOf} {
			for _, x := range l {
				walk(x)
			}
		}
	}
	for _, s := range t.Components.Schemas {
		walk(s)
	}
	for _, item := range t.Paths.Map() {
		for _, op := range item.Operations() {
			for _, r := range op.Responses.Map() {
				if r.Value != nil {
					for _, mt := range r.Value.Content {
						walk(mt.Schema)
					}
				}
			}
		}
	}
}
