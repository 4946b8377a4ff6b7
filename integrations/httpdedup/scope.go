package httpdedup

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// HeaderScope returns an Options.Scope that puts each request in the
// scope of the value of its header name: a credential (Authorization), an
// API key, a tenant. Every line of the header counts, in order, so two
// requests whose header differs in any line are in two scopes (a header
// sent twice is not read as its first line alone). The middleware stores
// the scope's SHA-256, never the value itself.
//
// A request without the header, or with only an empty one, is refused
// (403) when required is set. Otherwise it is in the anonymous scope,
// shared by every request that carries no such header: for
// Authorization, the requests with no credential, which nothing else
// tells apart.
func HeaderScope(name string, required bool) func(*http.Request) (string, error) {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		vs := r.Header.Values(name)
		if len(vs) == 1 {
			// One line: its value, as a single-valued header always was.
			if vs[0] == "" && required {
				return "", fmt.Errorf("the %s header names the client and is required", name)
			}
			return vs[0], nil
		}
		if len(vs) == 0 {
			if required {
				return "", fmt.Errorf("the %s header names the client and is required", name)
			}
			return "", nil
		}
		// Several lines: each length-prefixed after a NUL, which no header
		// value holds (net/http refuses control characters in values), so
		// no single value and no other list of lines encodes the same.
		var b strings.Builder
		b.WriteByte(0)
		for _, v := range vs {
			b.WriteString(strconv.Itoa(len(v)))
			b.WriteByte(':')
			b.WriteString(v)
		}
		return b.String(), nil
	}
}
