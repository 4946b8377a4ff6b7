// Package machine reads what this machine gives a process: its memory
// (the machine's, or its cgroup's limit when lower) and single figures of
// /proc files. The capacity planner fits plans in that memory, and the
// archive refuses filters larger than it at Open rather than be killed.
//
// It owns only the reading. It must never decide what fits (its callers
// do), never write anything, and never depend on anything but the
// standard library, so that the engine's core may import it.
package machine
