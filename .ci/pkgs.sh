# Sourced by .ci/run and .ci/test: what the tests cover and how they are
# split between the two passes.
#
# The repository's modules: the root one and the integrations whose
# libraries an engine-only program must not have its versions raised by
# (docs/layout.md#modules), and bench/redisclient, whose rueidis is for a
# measurement only; go.work joins them for one go test run.
MODULES="integrations/natsdedup integrations/oteldedup integrations/watermilldedup bench/redisclient"
PKGS="./..."
for m in $MODULES; do PKGS="$PKGS ./$m/..."; done
# go test starts packages in the order it is given them (the list keeps
# each package once), so the longest start first and none is left to run
# alone at the end: the packages over a minute and a half under -race
# without LONG (2026-12-07), longest first.
RACE_FIRST="./tier/redis/enginetest/ ./engine/ ./tier/embedded/enginetest/ ./tier/archive/enginetest/ ./tier/redis/ ./integrations/kafkadedup/ ./tier/postgres/ ./bench/ ./cmd/dedupbench/"
# LONG: the runs that cost the race detector most. Each took ten seconds or
# more under -race and at least 1.7 times as long as without it (go test
# -json of both, 2 cores, 2026-12-07): together 787 s under -race, 114 s
# without, where .ci/test runs them, once and in full. The race detector
# still covers their code (every path they drive runs under -race in
# shorter tests), and the runs whose point is concurrency (TestLinearizability,
# TestConformance*, TestReadAttackConcurrentSameKeys, TestBreakItForgetRacesMark,
# the *Races* and *Concurrent* attacks) and the long runs that mostly wait
# (Redis pauses, kills, lags: as long without -race) stay in the -race pass.
# TestKillWhileArchiving stays in the -race pass, where it has always run.
# TestKafkaKills (about 85 s under -race, 42 s without) runs without -race:
# in the -race pass beside the engine's packages its in-process kfake
# broker once left three partitions' fetches unanswered for four minutes
# after the group's joins timed out (2026-12-07, every consumer waiting in
# PollRecords); kafkadedup's other tests keep its code under -race.
# The attacks on a Forget's LogBy behind Redis's archive (TestFLB*, about
# three minutes that mostly wait on Redis's window) run without -race too:
# tier/redis/enginetest already bounds the -race pass; these two are not
# of the 1.7x rule above. Names are unique across the repository (.ci/test
# checks each names one test); a test named here runs in exactly one pass.
LONG_TESTS="
TestCompareAgainstRedis TestPlanJSON TestPlanSaysWhenItDoesNotFit TestRunWithArchive TestSampleFlag
TestFilterFalsePositivesMeasured TestMemModelGrowFromSmall TestTokenDeadlines
TestArchiveAttackCrashWhileArchiving TestArchiveKeepsHistory TestReadAttackSpanBound TestReadAttackWindowWidenedPastBound
TestGrowthLogMergeLargerStepGrows TestGrowthLogMergeSealedAroundLastGrowth TestGrowthLogResetDuringGrowth TestGrowthLogRotateDuringLastGrowth
TestGrowthLogSmallSnapshotThenGrow TestLayoutEveryWidth TestPlaceAllIsPlaceInTurn
TestCrashRecovery TestDiskOfTheArchive TestFootprintAttackDiskAcrossRotationsAndReopen TestFootprintAttackDiskTinyAndHugeKeys
TestGrowthAttackCrashDuringGrowth TestGrowthAttackRestartsWithChangedParameters TestGrowthAttackSealSmallThenGrow
TestGrowthLogAttackCrashAroundLastGrowth TestGrowthLogAttackReopenAcrossLastGrowth TestGrowthLogAttackWindowSlidesAtLastGrowth
TestGroupedLogNamespacesAndResults TestKafkaKills
TestFLBSkewAheadShortWindow TestFLBLateCopyMoments TestFLBForgetBatchMixedPaused TestFLBCloseWhileForgetStalled
TestFLBNamespaceArchiveWindow TestFLBMixedBatchLateCopy
"
LONG="^($(echo $LONG_TESTS | tr ' ' '|'))\$"
