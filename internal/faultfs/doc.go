// Package faultfs makes a Pebble filesystem misbehave on purpose, for tests
// of what the engine and tier/pebble do when the disk fails or stalls.
// Wrap puts injectors (errorfs.Injector, Pebble's own interface) in front
// of every file operation of a vfs.FS; Fault fails the operations a Match
// selects, every one or the n-th, once armed; Gate holds them while it is
// shut.
//
// It owns only the wrappers: the base filesystem (a vfs.MemFS, a crashable
// one to clone after a "crash", or vfs.Default) stays the caller's and is
// never changed but through the wrapped calls. It must never inject
// anything before a test arms it, never touch a file outside the calls
// that go through it, and never depend on anything but the standard
// library and Pebble's vfs and errorfs packages, so that both engine and
// tier/pebble tests can import it.
//
// Unlike errorfs.Wrap, Wrap also wraps the files it hands out through
// ReuseForWrite: Pebble writes a recycled WAL through such a file, and a
// fault or a gate on the WAL must reach it.
//
// # Concurrency
//
// An FS, a Fault and a Gate may be used by any number of goroutines; a
// test arms, disarms, shuts and opens them while the engine runs.
package faultfs
