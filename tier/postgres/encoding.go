package postgres

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
)

// committedColumn is the batch's digest column for Commit: a request's
// digest (empty for none), or with a result digest (zero for none) ‖ At
// (8 bytes, big endian) ‖ result, so a commit's result lives and expires
// with its row and every statement that clears the digest clears it too.
func committedColumn(reqs []tier.Request) [][]byte {
	col := digestColumn(reqs)
	for i := range reqs {
		if r := &reqs[i]; len(r.Result) > 0 {
			v := make([]byte, 0, len(r.Digest)+8+len(r.Result))
			v = append(v, r.Digest[:]...)
			v = binary.BigEndian.AppendUint64(v, uint64(r.At))
			col[i] = append(v, r.Result...)
		}
	}
	return col
}

// decodeCommitted reads a committed row's digest column into a.
func decodeCommitted(a *tier.Answer, col []byte) error {
	switch n := len(col); {
	case n == 0:
	case n == len(a.Digest):
		copy(a.Digest[:], col)
	case n > len(a.Digest)+8:
		copy(a.Digest[:], col)
		a.At = int64(binary.BigEndian.Uint64(col[16:24]))
		a.Result = col[24:] // pgx scans bytea into a fresh slice
	default:
		return fmt.Errorf("%w: digest column of %d bytes", ErrLayout, n)
	}
	return nil
}

// digestColumn is the batch's digests, empty for none.
func digestColumn(reqs []tier.Request) [][]byte {
	digests := make([][]byte, len(reqs))
	for i := range reqs {
		digests[i] = []byte{}
		if reqs[i].Digest != (tier.Digest{}) {
			digests[i] = reqs[i].Digest[:]
		}
	}
	return digests
}

// columns splits a batch into the statement's arrays, keys in their
// stored form.
func columns(reqs []tier.Request) (ns, keys, tokens [][]byte) {
	ns, keys, tokens = make([][]byte, len(reqs)), make([][]byte, len(reqs)), make([][]byte, len(reqs))
	size := 0
	for i := range reqs {
		size += 1 + min(len(reqs[i].Key), sha256.Size+MaxStoredKey)
	}
	buf := make([]byte, 0, size) // one allocation for the batch's stored keys
	for i := range reqs {
		start := len(buf)
		buf = appendStoredKey(buf, reqs[i].Key)
		ns[i], keys[i], tokens[i] = []byte(reqs[i].NS), buf[start:len(buf):len(buf)], reqs[i].Token[:]
	}
	return ns, keys, tokens
}

// MaxStoredKey is the longest key stored as it is; a longer one is stored
// as its SHA-256 (a B-tree index entry holds at most about 2.7 kB, and the
// engine accepts keys up to 64 KiB).
const MaxStoredKey = 1024

// appendStoredKey appends a key's form in the table: 0x00 and the key, or, over
// MaxStoredKey bytes, 0x01 and its SHA-256. The first byte keeps the two
// forms apart, so no short key can equal a long key's digest; SHA-256 is
// collision resistant, so nobody can make two long keys that collide.
func appendStoredKey(buf, key []byte) []byte {
	if len(key) > MaxStoredKey {
		sum := sha256.Sum256(key)
		return append(append(buf, 1), sum[:]...)
	}
	return append(append(buf, 0), key...)
}

// row is one row as stateQ and forgetQ return it, with the statement's
// clock reading.
type row struct {
	ns, key, token, digest []byte
	state                  string
	leaseEnd, expires, ms  int64
	attempts               int32
}

// scanRow reads the current row of rows.
func scanRow(rows pgx.Rows) (row, error) {
	var r row
	err := rows.Scan(&r.ns, &r.key, &r.state, &r.token, &r.leaseEnd, &r.attempts, &r.digest, &r.expires, &r.ms)
	return r, err
}

// committed makes a the answer for a committed row: its token, digest,
// time and result.
func (r *row) committed(a *tier.Answer) error {
	a.Status = tier.Committed
	copy(a.Token[:], r.token)
	return decodeCommitted(a, r.digest)
}

// rowID is the map key of a row's (ns, key): the namespace's length
// first, so two pairs never run together.
func rowID(ns, key []byte) string {
	return string(append(append(binary.AppendUvarint(nil, uint64(len(ns))), ns...), key...))
}
