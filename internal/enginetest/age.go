package enginetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// PGTable names a fresh table for one test (prefix and the time), dropped
// when the test ends.
func PGTable(t testing.TB, p *pgxpool.Pool, prefix string) string {
	table := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return table
}

// PGRows counts table's rows.
func PGRows(t testing.TB, p *pgxpool.Pool, table string) int {
	var n int
	if err := p.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// AgeRedis makes Redis's clock follow a jump of the test's clock: every key
// under prefix whose TTL is at most d is deleted, the others' TTLs shrink
// by d. Keys without a TTL (the prefix's layout record) are left alone.
func AgeRedis(ctx context.Context, c goredis.UniversalClient, prefix string, d time.Duration) error {
	age := func(ctx context.Context, c goredis.Cmdable) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			ttl, err := c.PTTL(ctx, k).Result()
			switch {
			case err != nil:
				return err
			case ttl < 0:
			case ttl <= d:
				err = c.Del(ctx, k).Err()
			default:
				err = c.PExpire(ctx, k, ttl-d).Err()
			}
			if err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if cc, ok := c.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error { return age(ctx, m) })
	}
	return age(ctx, c)
}

// AgePostgres makes the table's clock follow a jump of the test's clock:
// every lease end and expiry of the run comes d closer.
func AgePostgres(ctx context.Context, p *pgxpool.Pool, table string, d time.Duration) error {
	ms := d.Milliseconds()
	for try := 0; ; try++ {
		// The store's background sweep deletes rows while this updates
		// all of them: one of the two may be chosen as a deadlock victim.
		_, err := p.Exec(ctx, fmt.Sprintf("UPDATE %s SET lease_until = CASE WHEN lease_until > 0 THEN lease_until - $1 ELSE 0 END, expires = expires - $1", table), ms)
		var pe *pgconn.PgError
		if err == nil || try == 5 || !errors.As(err, &pe) || pe.Code != "40P01" {
			return err
		}
	}
}
