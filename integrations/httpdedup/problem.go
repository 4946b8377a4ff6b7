package httpdedup

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// problem is an application/problem+json body (RFC 9457).
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Window is how long a key is kept after its request completed, for
	// a client choosing when it may reuse one; ArchiveWindow how long its
	// engine's archive keeps it beyond (a key is a duplicate that long).
	Window        string `json:"idempotency_window,omitempty"`
	ArchiveWindow string `json:"idempotency_archive_window,omitempty"`
}

// Problem titles, each a case a client can act on; the type's URI ends
// with the title's slug.
const (
	titleMissing     = "Idempotency key missing"
	titleMalformed   = "Idempotency key malformed"
	titleTooLarge    = "Request body too large"
	titleScope       = "Client not identified"
	titleFingerprint = "Request not fingerprinted"
	titleConflict    = "Idempotency key reused"
	titleInFlight    = "Request in progress"
	titleUnknown     = "Outcome unknown"
	titleDamaged     = "Stored response unreadable"
	titleUnavailable = "Idempotency store unavailable"
	titlePanic       = "Handler failed"
)

// problem writes a problem+json response; retryAfter, when positive, is
// sent as Retry-After in whole seconds (at least one).
func (m *Middleware) problem(w http.ResponseWriter, status int, title, detail string, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(max(1, (retryAfter+time.Second-1)/time.Second))))
	}
	b := m.problemBody(status, title, detail)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// problemBody is the problem+json body of a problem response.
func (m *Middleware) problemBody(status int, title, detail string) []byte {
	p := problem{Type: m.o.ProblemBase + slug(title), Title: title, Status: status, Detail: detail}
	if status == http.StatusBadRequest || status == m.o.ConflictStatus {
		p.Window = m.ns.Window().String()
		if m.archive > 0 {
			p.ArchiveWindow = m.archive.String()
		}
	}
	b, _ := json.Marshal(p)
	return b
}
