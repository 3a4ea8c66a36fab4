package reports

import (
	"context"
	corev1 "k8s.io/api/core/v1"
	"maps"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
)

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// debounced enqueues the report an object's event can change, delay later: the queue holds
// an item once, so a burst of changes in a namespace is one rewrite.
type debounced struct {
	key     func(client.Object) (reconcile.Request, bool)
	delay   time.Duration
	changed func(old, new client.Object) bool
}

var _ handler.TypedEventHandler[client.Object, reconcile.Request] = debounced{}

func (d debounced) add(q queue, o client.Object) {
	req, ok := d.key(o)
	switch {
	case !ok:
	case d.delay > 0:
		q.AddAfter(req, d.delay)
	default:
		q.Add(req)
	}
}

func (d debounced) Create(_ context.Context, e event.CreateEvent, q queue) { d.add(q, e.Object) }
func (d debounced) Delete(_ context.Context, e event.DeleteEvent, q queue) { d.add(q, e.Object) }
func (d debounced) Generic(_ context.Context, e event.GenericEvent, q queue) {
	d.add(q, e.Object)
}
func (d debounced) Update(_ context.Context, e event.UpdateEvent, q queue) {
	if d.changed(e.ObjectOld, e.ObjectNew) {
		d.add(q, e.ObjectNew)
	}
}

// rateLimiter bounds the rewrites retried after errors, over all reports.
func rateLimiter() *rate.Limiter { return rate.NewLimiter(rate.Limit(10), 100) }

func anyChange(old, new client.Object) bool {
	return old.GetResourceVersion() != new.GetResourceVersion()
}

// vmiChanged: the migrationpolicy controller's decision on the VMI changed.
func vmiChanged(old, new client.Object) bool {
	return annotationsDiffer(old, new, migrationpolicy.AnnotationPolicy, migrationpolicy.AnnotationConfiguration)
}

// annotationsChanged: what the migrationpolicy status controller wrote on a policy changed.
func annotationsChanged(old, new client.Object) bool {
	return annotationsDiffer(old, new, migrationpolicy.AnnotationValid, migrationpolicy.AnnotationInvalidReason, migrationpolicy.AnnotationVMIs)
}

// nodeChanged: what the cluster report reads of a node changed: the nodelabeller's label or,
// with the CPU baseline, any label (KubeVirt's node labeller's among them) or schedulability.
func (r *Reconciler) nodeChanged(old, new client.Object) bool {
	if r.Engine == nil {
		return levelChanged(old, new)
	}
	o, okOld := old.(*corev1.Node)
	n, okNew := new.(*corev1.Node)
	if !okOld || !okNew {
		return anyChange(old, new)
	}
	return !maps.Equal(o.Labels, n.Labels) || o.Spec.Unschedulable != n.Spec.Unschedulable
}

// levelChanged: the nodelabeller's label on a node changed.
func levelChanged(old, new client.Object) bool {
	o, okOld := old.GetLabels()[nodelabeller.LabelLevel]
	n, okNew := new.GetLabels()[nodelabeller.LabelLevel]
	return o != n || okOld != okNew
}

func annotationsDiffer(old, new client.Object, keys ...string) bool {
	for _, k := range keys {
		o, okOld := old.GetAnnotations()[k]
		n, okNew := new.GetAnnotations()[k]
		if o != n || okOld != okNew {
			return true
		}
	}
	return false
}
