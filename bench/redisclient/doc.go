// Package redisclient measures the Redis clients the engine could use for
// its Redis tier, go-redis and rueidis, on the engine's own mark command,
// beside redis-benchmark sending that command (BenchmarkClients). It is a
// module of its own so that rueidis, which the engine does not use, is in
// no other module's graph. It owns a benchmark and nothing else: no
// package imports it, and it must never hold code the engine runs.
package redisclient
