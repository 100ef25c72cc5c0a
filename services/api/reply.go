package api

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// reply is an operation's HTTP answer; it travels back from another
// region as JSON (forward.go).
type reply struct {
	Status int               `json:"status"`
	Header map[string]string `json:"header,omitempty"`
	Body   []byte            `json:"body"`
}

// errReply renders err as a problem (problem.go).
func errReply(err error) reply {
	st, b := problem(err)
	return reply{Status: st, Header: map[string]string{"Content-Type": "application/problem+json"}, Body: b}
}

// jsonReply renders v with status; a v that does not render is an
// internal error, never an empty answer.
func jsonReply(status int, v any) reply {
	b, err := json.Marshal(v)
	if err != nil {
		return errReply(fmt.Errorf("render the answer: %w", err))
	}
	return reply{Status: status, Body: b}
}

// write sends rep, as JSON unless it names its Content-Type.
func write(w http.ResponseWriter, rep reply) {
	for k, v := range rep.Header {
		w.Header().Set(k, v)
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(rep.Status)
	_, _ = w.Write(rep.Body)
}
