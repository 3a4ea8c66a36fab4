package pool

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Pacing the plans VM and VMI updates ask for.
//
// Every update of a pool's VMs and VMIs asks for a plan of the whole pool, and a pool whose
// VMs are starting sees a steady stream of them: virt-controller and virt-handler write each
// VMI and VM several times on its way to Running. Planning on each one made the plans of a
// pool most of the controller's work while pools started (make scale: 24 plans a second for 20
// pools of 100 VMs, each converting the pool's 200 objects for the engine). A pool is planned
// at most once per interval on updates: an update within the interval after the pool's last
// plan asks for one at the interval's end, where the work queue merges it with the updates
// that follow; an update after a quiet interval plans at once. Creates and deletes of VMs and
// VMIs, and every change of the pool itself, plan at once.

// DefaultPlanInterval is the controller's --pool-plan-interval: a plan a second at most for a
// pool whose VMs are busy, while a pool that was quiet reacts at once.
const DefaultPlanInterval = time.Second

// pacer remembers when each pool was last planned.
type pacer struct {
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
}

// newPacer paces plans interval apart: 0 is DefaultPlanInterval, a negative interval none.
func newPacer(interval time.Duration, now func() time.Time) *pacer {
	if interval == 0 {
		interval = DefaultPlanInterval
	}
	if now == nil {
		now = time.Now
	}
	return &pacer{interval: interval, now: now, last: map[types.NamespacedName]time.Time{}}
}

// planned records that pool is being planned now.
func (p *pacer) planned(pool types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last[pool] = p.now()
}

// forget drops a pool that is gone.
func (p *pacer) forget(pool types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.last, pool)
}

// wait is how long an update of pool's VMs or VMIs waits for its plan: until the interval
// since the pool's last plan has passed.
func (p *pacer) wait(pool types.NamespacedName) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	last, ok := p.last[pool]
	if !ok {
		return 0
	}
	return max(0, last.Add(p.interval).Sub(p.now()))
}

// paced is h with its update events' requests paced by p; its other events are h's own.
func (p *pacer) paced(h handler.EventHandler) handler.EventHandler {
	if p.interval <= 0 {
		return h
	}
	return handler.Funcs{
		CreateFunc: h.Create,
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			h.Update(ctx, e, pacedQueue{TypedRateLimitingInterface: q, pacer: p})
		},
		DeleteFunc:  h.Delete,
		GenericFunc: h.Generic,
	}
}

// pacedQueue adds each request after the wait its pool's pace asks for.
type pacedQueue struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	pacer *pacer
}

func (q pacedQueue) Add(req reconcile.Request) {
	if d := q.pacer.wait(req.NamespacedName); d > 0 {
		plansDeferred.WithLabelValues(req.String()).Inc()
		q.AddAfter(req, d)
		return
	}
	q.TypedRateLimitingInterface.Add(req)
}
