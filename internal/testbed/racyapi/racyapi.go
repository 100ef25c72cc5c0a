// Package racyapi is an HTTP API with an Idempotency-Key bug on purpose,
// for the idemcheck kit to catch: it looks the key up, makes the effect,
// and only then stores its answer under the key, with nothing that holds
// a second request with the same key while the first is being processed.
// A replay after the answer is stored gets it back, and another body with
// the key is refused, so the simple cases pass; two requests at once both
// make the effect.
//
// POST /things (body: any JSON object with a string "unique") makes a
// thing; GET /things?unique=U lists the things made with U.
package racyapi

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// maxKey is the longest key taken.
const maxKey = 255

// work is how long making the effect takes (a database write, say): the
// window in which a second request with the key finds no stored answer.
// It is long beside a loaded machine's scheduling, so that a request cut
// halfway through it (the timeout-then-retry case's, cut at 100 ms in
// pkg/idemcheck/testdata/racyapi.yaml) has always been received, and
// always makes its effect after the cut.
const work = 200 * time.Millisecond

// stored is a key's answer and the hash of the body it answered.
type stored struct {
	hash   [32]byte
	status int
	body   []byte
}

// API is the server's state.
type API struct {
	mu      sync.Mutex
	things  []thing
	answers map[string]stored
}

type thing struct {
	ID     int    `json:"id"`
	Unique string `json:"unique"`
}

// New returns the API as a handler.
func New() http.Handler {
	a := &API{answers: map[string]stored{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /things", a.create)
	mux.HandleFunc("GET /things", a.list)
	return mux
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > maxKey {
		http.Error(w, `{"error":"a key of 1 to 255 characters is required"}`, http.StatusBadRequest)
		return
	}
	b, _ := io.ReadAll(r.Body)
	var in struct{ Unique string }
	if json.Unmarshal(b, &in) != nil || in.Unique == "" {
		http.Error(w, `{"error":"want a JSON object with unique"}`, http.StatusBadRequest)
		return
	}
	hash := sha256.Sum256(b)
	a.mu.Lock()
	prev, ok := a.answers[key]
	a.mu.Unlock()
	if ok { // the lookup
		if prev.hash != hash {
			http.Error(w, `{"error":"key reused with another body"}`, http.StatusUnprocessableEntity)
			return
		}
		write(w, prev.status, prev.body)
		return
	}
	// The bug: the effect, then the answer, with the key held by nobody
	// in between.
	time.Sleep(work)
	a.mu.Lock()
	t := thing{ID: len(a.things) + 1, Unique: in.Unique}
	a.things = append(a.things, t)
	body := fmt.Appendf(nil, `{"id":%d,"unique":%q}`, t.ID, t.Unique)
	a.answers[key] = stored{hash: hash, status: http.StatusCreated, body: body}
	a.mu.Unlock()
	write(w, http.StatusCreated, body)
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	u := r.URL.Query().Get("unique")
	a.mu.Lock()
	out := []thing{}
	for _, t := range a.things {
		if t.Unique == u {
			out = append(out, t)
		}
	}
	a.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"things": out})
	write(w, http.StatusOK, b)
}

func write(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
