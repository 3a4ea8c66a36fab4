package pool

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestSlowStartBatches(t *testing.T) {
	var (
		mu         sync.Mutex
		ran        []int
		inFlight   atomic.Int32
		mostAtOnce atomic.Int32
	)
	err := slowStart(100, func(i int) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := mostAtOnce.Load()
			if n <= m || mostAtOnce.CompareAndSwap(m, n) {
				break
			}
		}
		mu.Lock()
		ran = append(ran, i)
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != 100 {
		t.Fatalf("ran %d of 100", len(ran))
	}
	if m := mostAtOnce.Load(); m > maxCreatesInFlight {
		t.Fatalf("%d at once, want at most %d", m, maxCreatesInFlight)
	}
}

func TestSlowStartStopsAfterAFailingBatch(t *testing.T) {
	var calls atomic.Int32
	boom := errors.New("refused")
	// Batches 1, 2, 4: the one at index 4 (third batch) fails, so 1+2+4 calls, not 100.
	err := slowStart(100, func(i int) error {
		calls.Add(1)
		if i == 4 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	if got := calls.Load(); got != 7 {
		t.Fatalf("%d calls, want 7 (batches of 1, 2, 4)", got)
	}
}
