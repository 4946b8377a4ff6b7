// Package crashtest runs a test binary's own code in child processes, for
// tests that kill a process and check what survived it: TestMain hands a
// child its registered function (Main), a test starts children with a spec
// (Start, or Command for code that drives the process itself), reads their
// stdout lines as they come, waits for a line, signals them at a chosen
// moment (SIGKILL, SIGTERM) and describes them in failure messages with
// their last lines and stderr's first line.
//
// It owns the child processes it starts and nothing else: every child is
// killed and waited for when its test ends, a child still running at its
// deadline is killed and fails the test, and every wait on a child is
// bounded, so a hung child fails the test instead of hanging it.
//
// It must never signal a process it did not start (it signals children by
// their os.Process, never by a PID or a name), never outlive its test's
// cleanup, and never depend on anything but the standard library and
// package testing: any test package may import it.
//
// # Concurrency
//
// A Child's methods may be called from any goroutine. Options.OnLine is
// called on the goroutine reading the child's stdout, one line at a time,
// in order; while it blocks, that child's stdout is not read.
package crashtest
