package faultfs_test

import (
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/internal/faultfs"
)

func create(t *testing.T, fs vfs.FS, name string) vfs.File {
	t.Helper()
	f, err := fs.Create(name, "test")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFault(t *testing.T) {
	var fault faultfs.Fault
	fs := faultfs.Wrap(vfs.NewMem(), &fault)
	wal, sst := create(t, fs, "000001.log"), create(t, fs, "000002.sst")
	if _, err := wal.Write([]byte("x")); err != nil {
		t.Fatalf("write before arming: %v", err)
	}
	fault.Arm(faultfs.WALSyncs)
	if err := wal.Sync(); !errors.Is(err, faultfs.ErrInjected) {
		t.Fatalf("armed WAL sync: %v", err)
	}
	if _, err := wal.SyncTo(1); !errors.Is(err, faultfs.ErrInjected) {
		t.Fatalf("armed WAL SyncTo: %v", err)
	}
	if err := sst.Sync(); err != nil || fault.Hits() != 2 {
		t.Fatalf("SST sync %v, hits %d", err, fault.Hits())
	}
	fault.Disarm()
	if err := wal.Sync(); err != nil || fault.Hits() != 2 {
		t.Fatalf("disarmed: %v, hits %d", err, fault.Hits())
	}
	// The n-th: once, and counted on.
	fault.ArmNth(faultfs.Match{Kinds: faultfs.Writes, Contains: "0000"}, 2)
	var errs []error
	for range 4 {
		_, err := sst.Write([]byte("y"))
		errs = append(errs, err)
	}
	if errs[0] != nil || !errors.Is(errs[1], faultfs.ErrInjected) || errs[2] != nil || errs[3] != nil || fault.Seen() != 4 || fault.Hits() != 1 {
		t.Fatalf("ArmNth 2: %v, seen %d, hits %d", errs, fault.Seen(), fault.Hits())
	}
	// A reused file is wrapped under its new name.
	if err := wal.Close(); err != nil {
		t.Fatal(err)
	}
	reused, err := fs.ReuseForWrite("000001.log", "000003.log", "test")
	if err != nil {
		t.Fatal(err)
	}
	fault.Arm(faultfs.WALWrites)
	if _, err := reused.Write([]byte("z")); !errors.Is(err, faultfs.ErrInjected) {
		t.Fatalf("write to a reused WAL under a fault: %v", err)
	}
}

func TestGate(t *testing.T) {
	gate := faultfs.NewGate(faultfs.WALSyncs)
	fs := faultfs.Wrap(vfs.NewMem(), gate)
	wal := create(t, fs, "000001.log")
	if err := wal.Sync(); err != nil || gate.Waited() != 0 {
		t.Fatalf("open gate: %v, waited %d", err, gate.Waited())
	}
	gate.Shut()
	synced := make(chan error, 1)
	go func() { synced <- wal.Sync() }()
	for gate.Waited() == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-synced:
		t.Fatal("a sync passed a shut gate")
	case <-time.After(50 * time.Millisecond):
	}
	gate.Open()
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
}
