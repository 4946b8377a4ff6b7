// Package rabbitmqtest_test is the end-to-end test of the consumer loop
// over a real RabbitMQ (TestRabbitMQRedelivery): consumer processes,
// killed at random, claim, process, commit and ack through the engine,
// with the embedded store or Redis behind it, and every message's effect
// is checked to happen once. There is no RabbitMQ adapter: the loop is
// the engine's own (engine's Example_rabbitMQ). Tests only, through the
// engine's public API.
package rabbitmqtest_test
