package api

import (
	"encoding/json"
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

func jsonReply(status int, v any) reply {
	b, _ := json.Marshal(v)
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
