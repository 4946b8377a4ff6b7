// Package redistest starts and stops redis-server processes for tests: a
// single node, a replica, a sentinel or a three-master cluster, each on
// free loopback ports with a temporary directory, stopped by PID.
//
// It owns nothing but those processes, and the go-redis clients it makes
// for them (Client, ClientWith), each closed when its test ends. It must
// never reach a server it did not start, nor bind anything but 127.0.0.1.
//
// # Concurrency
//
// A Server is used by one test goroutine at a time.
package redistest
