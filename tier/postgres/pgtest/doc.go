// Package pgtest connects tests to the PostgreSQL on loopback (Pool), and
// runs a private server a test can kill (StartServer: its own data
// directory and loopback port). It owns nothing but those connections and
// processes: each test makes and drops its own tables. It must never reach
// a server that is not on loopback, nor stop one it did not start. With
// TIERDEDUP_REQUIRE_POSTGRES set (CI) a server that cannot be reached, or
// binaries that are missing, fail the test instead of skipping it.
package pgtest
