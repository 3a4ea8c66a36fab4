package engine

import (
	"context"
	"runtime"

	"golang.org/x/sync/errgroup"
)

// Preparing a MigrationPolicy set in chunks.
//
// The per-policy work of preparing a set, each policy's index entry and each policy's rules of
// the partial evaluation of `matching`, depends on that policy alone (migrationpolicyreuse.go
// reuses it policy by policy). A set of many policies is therefore prepared in chunks, one
// goroutine each, up to GOMAXPROCS: the entries of each chunk, then the index assembled from
// them as after a change; the partial evaluation of each chunk's policies, then one compilation
// of all their rules. The Go reference prepares on one goroutine, so the benchmarks report the
// CPU time beside the wall time.

// prepareChunking bounds the chunks: each holds at least min policies (fewer are not worth
// the index assembled from the chunks), and there are at most max of them (0: GOMAXPROCS).
// Tests lower them to prepare small sets in chunks.
var prepareChunking = struct{ min, max int }{min: 512}

// prepareChunks splits n policies into chunks as [start, end) ranges: one when n is too few
// for two.
func prepareChunks(n int) [][2]int {
	most := prepareChunking.max
	if most <= 0 {
		most = runtime.GOMAXPROCS(0)
	}
	k := max(1, min(most, n/max(1, prepareChunking.min)))
	out := make([][2]int, k)
	for i := range k {
		out[i] = [2]int{i * n / k, (i + 1) * n / k}
	}
	return out
}

// inChunks calls f for each chunk of n policies, concurrently when there are several, and
// returns the first error.
func inChunks(ctx context.Context, n int, f func(ctx context.Context, chunk, start, end int) error) error {
	chunks := prepareChunks(n)
	if len(chunks) == 1 {
		return f(ctx, 0, 0, n)
	}
	eg, ctx := errgroup.WithContext(ctx)
	for i, c := range chunks {
		eg.Go(func() error { return f(ctx, i, c[0], c[1]) })
	}
	return eg.Wait()
}
