package pool

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virt-rules/virt-rules/controllers/kinds"
)

// TestPacedUpdates drives a paced handler with a work queue on a fake clock: an update plans at
// once unless the pool was planned within the interval, and then when the interval ends, one
// plan for all the updates meanwhile; creates and deletes plan at once.
func TestPacedUpdates(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Clock: clock})
	defer q.ShutDown()
	p := newPacer(time.Second, clock.Now)
	key := types.NamespacedName{Namespace: "ns", Name: "pace"}
	toPool := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: key}}
	})
	h, ctx := p.paced(toPool), context.Background()
	vm := kinds.NewObject(GVKVirtualMachine)
	vm.SetNamespace("ns")
	vm.SetName("pace-1")
	vm.SetResourceVersion("1")
	next := vm.DeepCopy()
	next.SetResourceVersion("2")
	update := func() { h.Update(ctx, event.UpdateEvent{ObjectOld: vm, ObjectNew: next}, q) }
	// take hands out what is queued now, and marks it done: the next plan may be queued.
	take := func() []reconcile.Request {
		t.Helper()
		var got []reconcile.Request
		for q.Len() > 0 {
			r, _ := q.Get()
			q.Done(r)
			got = append(got, r)
		}
		return got
	}
	deferred := func() float64 { return testutil.ToFloat64(plansDeferred.WithLabelValues(key.String())) }
	before := deferred()

	update()
	if got := take(); len(got) != 1 {
		t.Fatalf("an update of a pool never planned: queued %v, want it at once", got)
	}
	p.planned(key)
	clock.Step(300 * time.Millisecond)
	update()
	update()
	if got := take(); len(got) != 0 {
		t.Fatalf("updates 300ms after the pool's plan: queued %v at once, want them after the interval", got)
	}
	if got := deferred() - before; got != 2 {
		t.Errorf("%s counted %v deferred updates, want 2", "virtrules_pool_plans_deferred_total", got)
	}
	h.Create(ctx, event.CreateEvent{Object: next}, q)
	if got := take(); len(got) != 1 {
		t.Fatalf("a create within the interval: queued %v, want it at once", got)
	}
	clock.Step(699 * time.Millisecond)
	if got := take(); len(got) != 0 {
		t.Fatalf("1ms before the interval's end: queued %v", got)
	}
	clock.Step(time.Millisecond)
	waitFor(t, func() bool { return q.Len() > 0 })
	if got := take(); len(got) != 1 || got[0].NamespacedName != key {
		t.Fatalf("at the interval's end: queued %v, want one plan of %s for both updates", got, key)
	}
	p.planned(key)
	h.Delete(ctx, event.DeleteEvent{Object: next}, q)
	if got := take(); len(got) != 1 {
		t.Fatalf("a delete within the interval: queued %v, want it at once", got)
	}
	// After a quiet interval an update plans at once again.
	clock.Step(time.Second)
	update()
	if got := take(); len(got) != 1 {
		t.Fatalf("an update a quiet interval after the last plan: queued %v, want it at once", got)
	}
	// A pool that is gone is forgotten.
	p.planned(key)
	p.forget(key)
	if w := p.wait(key); w != 0 {
		t.Errorf("a forgotten pool waits %s", w)
	}
}

// TestUnpaced: a negative interval leaves the handler as it is.
func TestUnpaced(t *testing.T) {
	h := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request { return nil })
	if got := newPacer(-1, nil).paced(h); got != h {
		t.Errorf("a negative interval paced the handler")
	}
	if p := newPacer(0, nil); p.interval != DefaultPlanInterval {
		t.Errorf("interval 0: %s, want the default %s", p.interval, DefaultPlanInterval)
	}
}

// waitFor waits a second at most for the work queue's delaying goroutine.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}
