// Package rabbittest connects tests to the RabbitMQ on loopback
// (127.0.0.1:5672, guest/guest). It owns the rule every RabbitMQ test
// follows: with TIERDEDUP_REQUIRE_RABBITMQ set (as .ci/run sets it) a
// broker that cannot be reached fails the test; without it the test is
// skipped. It must never start or stop the broker, nor send traffic
// anywhere but loopback.
package rabbittest

import (
	"os"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// URL is the loopback broker the tests use.
	URL = "amqp://guest:guest@127.0.0.1:5672/"
	// RequireEnv, when set, makes an unreachable broker a failure.
	RequireEnv = "TIERDEDUP_REQUIRE_RABBITMQ"
)

// Dial connects to URL, failing the test (RequireEnv set) or skipping it
// when the broker cannot be reached.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(URL)
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("RabbitMQ at %s is required (%s is set): %v", URL, RequireEnv, err)
		}
		t.Skipf("no RabbitMQ at %s (set %s to make this a failure): %v", URL, RequireEnv, err)
	}
	return conn
}
