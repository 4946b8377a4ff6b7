package engine

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// One-time tokens live in two namespaces of the engine's own, whose names
// start with a NUL byte (refused to callers): a token's issue record, with
// its expiry as the commit's result, and its use mark.
const (
	tokenIssued = "\x00token/issued"
	tokenUsed   = "\x00token/used"
	tokenBytes  = 16
)

// IssueToken returns a new one-time token: 128 random bits, URL-safe, stored
// durably with its expiry ttl from now (at most the engine's Window: the
// store keeps the token's record for the window). Hand it to the client
// (a form, a retryable request) and ConsumeToken it once. A call that
// stalls longer than the Lease between storing the token and committing it
// fails with ErrLeaseLost and issues nothing: retry.
func (e *Engine) IssueToken(ctx context.Context, ttl time.Duration) (string, error) {
	if ttl <= 0 || int64(ttl) > e.window {
		return "", fmt.Errorf("%w: token ttl %v is outside (0, %v]", ErrOptions, ttl, time.Duration(e.window))
	}
	if err := e.serve(NeedTokens, "IssueToken"); err != nil {
		// Memory-only forgets at eviction: a used token's mark could go
		// while its issue stays, and the token would be used twice.
		return "", err
	}
	ctx, done, err := e.hold(ctx) // Close waits for the claim's commit or release
	if err != nil {
		return "", err
	}
	defer done()
	raw := make([]byte, tokenBytes)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	ns := e.newNamespace(tokenIssued)
	c, err := ns.Claim(ctx, raw)
	if err != nil {
		return "", err
	}
	if c.Outcome != New {
		// 128 random bits met an issued token: never in practice, and
		// never handed out twice.
		return "", fmt.Errorf("%w: a fresh token was %v", ErrStorage, c.Outcome)
	}
	now, err := e.now()
	if err != nil {
		return "", errors.Join(err, e.Release(ctx, c))
	}
	c.Result = binary.BigEndian.AppendUint64(nil, uint64(now+int64(ttl)))
	if err := e.Commit(ctx, c); err != nil {
		if !errors.Is(err, ErrLeaseLost) {
			gctx, cancel := giveBackContext(ctx)
			defer cancel()
			if rerr := e.Release(gctx, c); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
				err = errors.Join(err, rerr)
			}
		}
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(raw), nil
}

// ConsumeToken uses token once. It returns nil for the one call that
// consumes it; ErrTokenUsed for every call after that one; ErrInFlight
// while another call is consuming it (or when this call stalled past the
// Lease before its use was durable): the token is not used yet, retry;
// ErrTokenExpired once its ttl has passed, used or not; ErrTokenUnknown
// for a string IssueToken did not return (one token has one spelling), or
// a token this engine's state never issued (or issued more than a Window
// ago). Memory-only and bloom-only issue no tokens (ErrOptions): they
// cannot keep a use. Options.FailOpen does not apply: an unavailable
// shared tier is ErrUnavailable. Other errors are the engine's: the token
// is then neither consumed nor refused, and the call may be retried.
func (e *Engine) ConsumeToken(ctx context.Context, token string) error {
	if err := e.serve(NeedTokens, "ConsumeToken"); err != nil {
		return err
	}
	raw, ok := decodeToken(token)
	if !ok {
		return fmt.Errorf("%w: not a token", ErrTokenUnknown)
	}
	ctx, done, err := e.hold(ctx)
	if err != nil {
		return err
	}
	defer done()
	issued, err := e.newNamespace(tokenIssued).Lookup(ctx, raw)
	if err != nil {
		return err
	}
	if issued.Outcome != Duplicate || len(issued.Result) != 8 {
		return ErrTokenUnknown
	}
	now, err := e.now()
	if err != nil {
		return err
	}
	if expiry := int64(binary.BigEndian.Uint64(issued.Result)); now >= expiry {
		return fmt.Errorf("%w: expired %v ago", ErrTokenExpired, time.Duration(now-expiry))
	}
	switch o, err := e.newNamespace(tokenUsed).MarkIfAbsent(ctx, raw); {
	case err != nil:
		return err
	case o == New:
		return nil
	case o == Duplicate:
		return ErrTokenUsed
	default:
		// InFlight: another call is consuming it now, or this call's own
		// use lost its lease before it committed (a stall longer than the
		// Lease). Neither used it yet: not a verdict, retry.
		return fmt.Errorf("%w: the token's use is held (%v); retry", ErrInFlight, o)
	}
}

// decodeToken returns the 128 bits a token string names, and false for any
// string but the one IssueToken encodes for them: base64's decoder accepts
// several spellings of one value (the last character's unused bits, line
// breaks), and a string never issued must not consume a real token.
func decodeToken(token string) ([]byte, bool) {
	if len(token) != base64.RawURLEncoding.EncodedLen(tokenBytes) {
		return nil, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) != tokenBytes || base64.RawURLEncoding.EncodeToString(raw) != token {
		return nil, false
	}
	return raw, true
}
