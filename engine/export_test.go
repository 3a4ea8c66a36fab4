package engine

import "testing"

// PrepareInChunks makes MigrationPolicies prepare the per-policy work of a set of two or more
// policies in chunks of at least one policy, at most most chunks, until tb ends: small sets
// then take the path of large ones (migrationpolicychunks.go).
func PrepareInChunks(tb testing.TB, most int) {
	tb.Helper()
	saved := prepareChunking
	prepareChunking.min, prepareChunking.max = 1, most
	tb.Cleanup(func() { prepareChunking = saved })
}
