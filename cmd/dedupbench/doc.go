// Command dedupbench measures tierdedup on this machine and turns the
// measurements into a capacity plan.
//
//	dedupbench [run] [flags]   run the embedded default on a realistic workload
//	dedupbench plan [flags]    size memory, Bloom filters and disk for a load
//	dedupbench compare [flags] the engine beside Redis SET NX, PostgreSQL and Pebble alone
//	dedupbench footprint [flags] a default engine's disk, heap and RSS as it fills
//	dedupbench crash [flags]   the crash table, reproduced with real processes
//	dedupbench recover [flags] reopening after a kill -9: time to warm filters
//	dedupbench help [command]  every command and its flags, or one command's
//
// Every subcommand takes -json for machines; run and compare take -report
// out.html for a self-contained page. It only binds flags: the work is in
// package bench.
package main
