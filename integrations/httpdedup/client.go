package httpdedup

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// Transport is an http.RoundTripper that makes a request and its retries
// one logical request: it gives each request of Methods that has no
// Idempotency-Key a new random one, and sends it again with the same key
// on a network error, 409, 429, 502, 503 or 504, after a backoff with full
// jitter or the Retry-After the server asked for, until it gets another
// answer, MaxAttempts is reached or the request's context ends. A server
// behind the middleware then runs it once, and every attempt after the one
// that ran gets its response.
//
//	client := &http.Client{Transport: &httpdedup.Transport{}}
//
// A replayed response (Idempotent-Replayed: true) is the request's stored
// answer, whatever its status, and is returned at once. A 500 is not
// retried: behind the middleware it is a handler's failure
// (retry it as a new request, under a new key, if that is what you mean)
// or an outcome the server cannot know. A request body is kept in memory
// for the retries unless the request has GetBody (http.NewRequest sets it
// for bytes, strings and bytes.Buffer bodies).
type Transport struct {
	// Base sends each attempt; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Methods are the methods whose requests get a key and retries;
	// default POST and PATCH. Others are sent once, as they are.
	Methods []string
	// MaxAttempts bounds the attempts of one request; default 5.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait before each retry, doubled
	// from MinBackoff on each one, and drawn uniformly below it; defaults
	// 100 ms and 5 s. A Retry-After longer than the backoff is waited
	// instead, up to MaxRetryAfter (default 30 s; a longer one returns the
	// response).
	MinBackoff, MaxBackoff, MaxRetryAfter time.Duration
	// NewKey returns a fresh key; nil means 128 random bits, base64url.
	NewKey func() string
}

// RoundTrip sends req, and again with the same key as the Transport says.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	methods := t.Methods
	if methods == nil {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	if !slices.Contains(methods, req.Method) {
		return base.RoundTrip(req)
	}
	req, err := t.keyed(req)
	if err != nil {
		return nil, err
	}
	attempts := t.MaxAttempts
	if attempts <= 0 {
		attempts = 5
	}
	backoff := orDefault(t.MinBackoff, 100*time.Millisecond)
	for attempt := 1; ; attempt++ {
		r := req
		if attempt > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			r = req.Clone(req.Context())
			r.Body = body
		}
		resp, err := base.RoundTrip(r)
		wait, retry := t.retryable(req.Context(), resp, err, backoff)
		if !retry || attempt == attempts {
			return resp, err
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
		}
		if !sleep(req.Context(), wait) {
			return nil, req.Context().Err()
		}
		backoff = min(2*backoff, orDefault(t.MaxBackoff, 5*time.Second))
	}
}

// keyed returns req with a key (a copy if it had none) and a body that
// can be sent again.
func (t *Transport) keyed(req *http.Request) (*http.Request, error) {
	out := req
	if req.Header.Get(HeaderKey) == "" {
		out = req.Clone(req.Context())
		key := ""
		if t.NewKey != nil {
			key = t.NewKey()
		} else {
			var b [16]byte
			_, _ = crand.Read(b[:])
			key = base64.RawURLEncoding.EncodeToString(b[:])
		}
		sf, err := sfString(key)
		if err != nil {
			return nil, err
		}
		out.Header.Set(HeaderKey, sf)
	}
	if out.Body != nil && out.Body != http.NoBody && out.GetBody == nil {
		b, err := io.ReadAll(out.Body)
		_ = out.Body.Close()
		if err != nil {
			return nil, err
		}
		if out == req {
			out = req.Clone(req.Context())
		}
		out.Body = io.NopCloser(bytes.NewReader(b))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	return out, nil
}

// sfString serializes key as an RFC 8941 String: printable ASCII, with
// '"' and '\\' escaped; anything else cannot be one.
func sfString(key string) (string, error) {
	b := make([]byte, 0, len(key)+2)
	b = append(b, '"')
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("httpdedup: key %q: an Idempotency-Key is printable ASCII", key)
		default:
			b = append(b, c)
		}
	}
	return string(append(b, '"')), nil
}

// retryable says whether an attempt's result is worth another attempt
// with the same key, and after how long.
func (t *Transport) retryable(ctx context.Context, resp *http.Response, err error, backoff time.Duration) (time.Duration, bool) {
	jitter := time.Duration(rand.Int64N(int64(backoff) + 1))
	if err != nil {
		// The request's own end is final; any other failure may have lost
		// the response of a request that ran: the retry gets it.
		return jitter, ctx.Err() == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	if resp.Header.Get(HeaderReplayed) == "true" {
		return 0, false // the request's stored answer: it will not change
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return 0, false
	}
	if after, ok := retryAfter(resp.Header.Get("Retry-After")); ok {
		if after > orDefault(t.MaxRetryAfter, 30*time.Second) {
			return 0, false
		}
		return max(after, jitter), true
	}
	return jitter, true
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		// Capped at a year, so a huge value cannot overflow into a short
		// (negative) wait.
		return time.Duration(min(s, 365*24*3600)) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(at)), true
	}
	return 0, false
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
