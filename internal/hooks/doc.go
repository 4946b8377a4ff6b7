// Package hooks holds the points where tests of this module hold the
// engine's background work back, so they can observe a state that is
// otherwise brief. It owns those variables and nothing else: production
// code only reads them, and nothing outside the module can reach them.
// It must never hold behaviour of its own.
package hooks
