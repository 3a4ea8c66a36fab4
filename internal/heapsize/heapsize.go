// Package heapsize measures the live Go heap, for tests that report what cached objects cost.
package heapsize

import "runtime"

// Live is the heap held once collections free no more (finalizers and cleanups, such as
// those of sync.Pool, take more than one collection).
func Live() uint64 {
	var m runtime.MemStats
	last := ^uint64(0)
	for range 20 {
		runtime.GC()
		runtime.ReadMemStats(&m)
		if m.HeapAlloc >= last {
			break
		}
		last = m.HeapAlloc
	}
	return m.HeapAlloc
}
