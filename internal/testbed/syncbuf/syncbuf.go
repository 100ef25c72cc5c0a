// Package syncbuf is a text buffer that one goroutine may write (a logger,
// a demo's or a fault plan's output) while a test reads it.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer is a strings.Builder safe for concurrent writes and reads. The
// zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
