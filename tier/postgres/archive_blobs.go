package postgres

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
)

// chunkWriter inserts a blob's chunks as they fill.
type chunkWriter struct {
	ctx  context.Context
	tx   pgx.Tx
	t    string
	name string
	buf  []byte
	n    int
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		k := min(len(p), blobChunk-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == blobChunk {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return total, nil
}

func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	if _, err := w.tx.Exec(w.ctx, `INSERT INTO `+w.t+`_blobs VALUES ($1, $2, $3)`, w.name, w.n, w.buf); err != nil {
		return err
	}
	w.n++
	w.buf = w.buf[:0]
	return nil
}

// PutBlob replaces the named blob in one transaction.
func (ar *pgArchive) PutBlob(ctx context.Context, name string, write func(io.Writer) error) error {
	tx, err := ar.db.Begin(ctx)
	if err != nil {
		return unavailable("archive blob", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `DELETE FROM `+ar.t+`_blobs WHERE name = $1`, name); err != nil {
		return unavailable("archive blob", err)
	}
	w := &chunkWriter{ctx: ctx, tx: tx, t: ar.t, name: name, buf: make([]byte, 0, blobChunk)}
	if err := write(w); err != nil {
		return unavailable("archive blob", err)
	}
	if err := w.flush(); err != nil {
		return unavailable("archive blob", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return unavailable("archive blob", err)
	}
	return nil
}

type memBlob struct{ *bytes.Reader }

func (memBlob) Close() error { return nil }

// Blob reads the named blob whole.
func (ar *pgArchive) Blob(ctx context.Context, name string) (tier.ReadBlob, bool, error) {
	rows, err := ar.db.Query(ctx, `SELECT chunk, data FROM `+ar.t+`_blobs WHERE name = $1 ORDER BY chunk`, name)
	if err != nil {
		return nil, false, unavailable("archive blob", err)
	}
	defer rows.Close()
	var all []byte
	n := 0
	for rows.Next() {
		var chunk int
		var data []byte
		if err := rows.Scan(&chunk, &data); err != nil {
			return nil, false, unavailable("archive blob", err)
		}
		if chunk != n {
			return nil, false, fmt.Errorf("%w: blob %s misses chunk %d", tier.ErrStorage, name, n)
		}
		all = append(all, data...)
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, false, unavailable("archive blob", err)
	}
	if n == 0 {
		return nil, false, nil
	}
	return memBlob{bytes.NewReader(all)}, true, nil
}

// Blobs lists the blobs.
func (ar *pgArchive) Blobs(ctx context.Context) ([]string, error) {
	rows, err := ar.db.Query(ctx, `SELECT DISTINCT name FROM `+ar.t+`_blobs ORDER BY name`)
	if err == nil {
		var out []string
		if out, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
			return out, nil
		}
	}
	return nil, unavailable("archive blobs", err)
}

// DeleteBlob removes a blob.
func (ar *pgArchive) DeleteBlob(ctx context.Context, name string) error {
	if _, err := ar.db.Exec(ctx, `DELETE FROM `+ar.t+`_blobs WHERE name = $1`, name); err != nil {
		return unavailable("archive blob", err)
	}
	return nil
}
