package httpdedup_test

import (
	"net/http"
	"testing"

	"github.com/tierdedup/tierdedup/integrations/httpdedup"
)

// TestHeaderScope: every line of the header names the scope, so header
// lists that differ in any line, or a list and a single value, never share
// one; a missing header is refused when required and anonymous otherwise.
func TestHeaderScope(t *testing.T) {
	req := func(lines ...string) *http.Request {
		r, _ := http.NewRequest("POST", "http://x/", nil)
		for _, l := range lines {
			r.Header.Add("authorization", l)
		}
		return r
	}
	opt := httpdedup.HeaderScope("Authorization", false)
	seen := map[string]int{}
	for i, lines := range [][]string{
		{"Bearer a"}, {"Bearer A"}, {"Bearer a", "Bearer b"}, {"Bearer a", "Bearer c"},
		{"Bearer b", "Bearer a"}, {"Bearer a", ""}, {"Bearer a", "", ""}, {"1:a"}, {"a", "b"}, {"ab"}, {"a,b"},
	} {
		s, err := opt(req(lines...))
		if err != nil {
			t.Fatalf("%q: %v", lines, err)
		}
		if j, ok := seen[s]; ok {
			t.Errorf("lines %d %q share a scope with lines %d", i, lines, j)
		}
		seen[s] = i
	}
	if s, err := opt(req()); err != nil || s != "" {
		t.Errorf("no credential: %q, %v; want the anonymous scope", s, err)
	}
	if s, err := opt(req("Bearer a")); err != nil || s != "Bearer a" {
		t.Errorf("one line: %q, %v; want its value", s, err)
	}
	required := httpdedup.HeaderScope("x-tenant", true)
	for _, lines := range [][]string{nil, {""}} {
		r, _ := http.NewRequest("POST", "http://x/", nil)
		for _, l := range lines {
			r.Header.Add("X-Tenant", l)
		}
		if _, err := required(r); err == nil {
			t.Errorf("required, %q: no error", lines)
		}
	}
}
