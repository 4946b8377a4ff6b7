package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

func TestRunPrintsEveryFigure(t *testing.T) {
	var out, errOut bytes.Buffer
	report := filepath.Join(t.TempDir(), "r.html")
	if err := run(context.Background(), []string{"run", "-keys", "100000", "-report", report}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	for _, want := range []string{"keys/s", "billion IDs/day", "batch latency", "per-key latency", "heap", "disk", "bloom false positives", "hit ratios", "0 new keys dropped, 0 duplicates let through"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	page, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("<svg")) || bytes.Contains(page, []byte("http://")) && !bytes.Contains(page, []byte("http://www.w3.org/2000/svg")) {
		t.Errorf("report is not a self-contained page with an inline chart")
	}
}

func TestRunJSON(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-keys", "50000", "-tiers", "memory", "-json"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var res bench.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err, out.String())
	}
	if res.Keys != 50000 || res.KeysPerSec <= 0 || res.Tiers != "memory" {
		t.Fatalf("result %+v", res)
	}
}

func TestPlanJSON(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"plan", "-ids-per-day", "5e8", "-calibrate", "50000", "-json"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var pl bench.Plan
	if err := json.Unmarshal(out.Bytes(), &pl); err != nil {
		t.Fatal(err)
	}
	if pl.Live != 8 || pl.BloomBytes <= 0 || pl.DiskBytes <= 0 || pl.Headroom <= 0 {
		t.Fatalf("plan %+v", pl)
	}
}

func TestCompareAgainstRedis(t *testing.T) {
	srv := redistest.Start(t)
	var out, errOut bytes.Buffer
	args := []string{"compare", "-keys", "50000", "-redis", srv.Addr, "-postgres", "postgres://nobody@127.0.0.1:1/none", "-budget", "1s"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	s := out.String()
	if !strings.Contains(s, "redis SET NX EX per message") || !strings.Contains(s, "faster") {
		t.Errorf("no Redis row with a ratio:\n%s", s)
	}
	if !strings.Contains(s, "skipped: no PostgreSQL") {
		t.Errorf("an unreachable PostgreSQL is not reported as skipped:\n%s", s)
	}
}

func TestUnknownCommand(t *testing.T) {
	if err := run(context.Background(), []string{"frobnicate"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("unknown command accepted")
	}
}
