// Package sfv parses Structured Field Values for HTTP (RFC 8941) Items:
// the syntax of the Idempotency-Key header field, whose value is an Item
// holding a String. It owns the grammar and nothing else: it never
// decides what a value means (whether a key is acceptable, how long it
// may be), and it never allocates beyond the values it returns.
package sfv
