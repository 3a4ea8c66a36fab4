package migrationpolicy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
)

// PolicySets keeps the engine's prepared policy set for the current MigrationPolicies and
// KubeVirt CR, shared by the controller and the webhook. Safe for concurrent use.
//
// Watched (Watch), it lists the policies and the KubeVirt CR again only after an event of
// either: at 10,000 VMIs and 1,000 policies, listing and checking every policy on each VMI's
// reconcile was a fifth of the controller's CPU while VMIs were created. Whoever acts on such an
// event calls Changed before acting (the controller's watches do, before they queue VMIs), so
// that what it starts sees the change whichever informer handler runs first.
type PolicySets struct {
	Client client.Reader
	Engine Decider

	// changes counts the events of policies and the KubeVirt CR seen by Watch and Changed.
	changes atomic.Uint64
	watched atomic.Bool

	mu       sync.Mutex
	set      *engine.MigrationPolicies
	seen     uint64                 // changes when set was last found current
	versions map[string]specVersion // of set's policies, by name
	kubevirt specVersion            // of set's KubeVirt CR
}

// Watch makes Current list the MigrationPolicies and the KubeVirt CR again only after the
// informers report an event of one of them. Once both informers have listed, each event also
// has the set prepared at once, in the background (events that come meanwhile are prepared
// together, after): the reconciles the event queues find it ready, instead of all waiting for
// the first of them to prepare it.
func (p *PolicySets) Watch(ctx context.Context, informers cache.Informers) error {
	kick := make(chan struct{}, 1)
	changed := func(any) {
		p.Changed()
		select {
		case kick <- struct{}{}:
		default: // a preparation is due already, and will see this change
		}
	}
	var registrations []toolscache.ResourceEventHandlerRegistration
	for _, gvk := range []schema.GroupVersionKind{GVKMigrationPolicy, GVKKubeVirt} {
		inf, err := informers.GetInformer(ctx, kinds.NewObject(gvk), cache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("watch %s for the policy sets: %w", gvk.Kind, err)
		}
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: changed, UpdateFunc: func(_, obj any) { changed(obj) }, DeleteFunc: changed,
		})
		if err != nil {
			return fmt.Errorf("watch %s for the policy sets: %w", gvk.Kind, err)
		}
		registrations = append(registrations, reg)
	}
	p.watched.Store(true)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-kick:
			}
			// Before both informers listed, the events are the first list's: the first
			// decision prepares the set from all of it.
			if registrations[0].HasSynced() && registrations[1].HasSynced() {
				p.prepare(ctx)
			}
		}
	}()
	return nil
}

// prepare makes the current set ready for decisions: listed, converted, and indexed for the
// serving bundle. A failure is logged; the next decision prepares the set again and returns it.
func (p *PolicySets) prepare(ctx context.Context) {
	set, err := p.Current(ctx)
	if err == nil {
		_, err = set.Malformed(ctx)
	}
	if err != nil && ctx.Err() == nil {
		log.FromContext(ctx).Error(err, "prepare the migration policy set after a change; the next decision prepares it again")
	}
}

// Changed tells the sets that a MigrationPolicy or the KubeVirt CR changed: the next Current
// looks at them again.
func (p *PolicySets) Changed() { p.changes.Add(1) }

// Current returns the prepared policy set for the current MigrationPolicies and KubeVirt CR,
// rebuilding it only when the spec of one of them changed (see specVersion). Watched, and
// with no event since it last looked, it returns the set without listing; otherwise checking
// costs one map lookup per policy and allocates nothing.
func (p *PolicySets) Current(ctx context.Context) (*engine.MigrationPolicies, error) {
	seen := p.changes.Load()
	if p.watched.Load() {
		p.mu.Lock()
		set := p.set
		current := set != nil && p.seen == seen
		p.mu.Unlock()
		if current {
			return set, nil
		}
	}
	policies := kinds.NewList(GVKMigrationPolicy)
	if err := p.Client.List(ctx, policies, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list migration policies: %w", err)
	}
	kubevirts := kinds.NewList(GVKKubeVirt)
	if err := p.Client.List(ctx, kubevirts, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list kubevirt: %w", err)
	}
	kubevirt := kinds.ClusterKubeVirt(kubevirts.Items)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.set != nil && p.seen > seen {
		// Another call listed after an event this one listed before: its set is newer.
		return p.set, nil
	}
	if p.set != nil && p.unchanged(policies.Items, kubevirt) {
		p.seen = seen
		return p.set, nil
	}
	objs := make([]*unstructured.Unstructured, len(policies.Items))
	versions := make(map[string]specVersion, len(policies.Items))
	for i := range policies.Items {
		objs[i] = &policies.Items[i]
		versions[objs[i].GetName()] = specVersionOf(objs[i])
	}
	// The engine neither changes nor keeps the objects: the cache's own are passed as listed.
	set, err := p.Engine.MigrationPolicies(objs, kubevirt)
	if err != nil {
		return nil, err
	}
	p.set, p.versions, p.kubevirt, p.seen = set, versions, specVersionOf(kubevirt), seen
	return set, nil
}

// unchanged tells whether policies and kubevirt have the spec versions the set was prepared
// from. Call with mu held.
func (p *PolicySets) unchanged(policies []unstructured.Unstructured, kubevirt *unstructured.Unstructured) bool {
	if len(policies) != len(p.versions) || specVersionOf(kubevirt) != p.kubevirt {
		return false
	}
	for i := range policies {
		if v, ok := p.versions[policies[i].GetName()]; !ok || v != specVersionOf(&policies[i]) {
			return false
		}
	}
	return true
}

// specVersion identifies what a decision reads of an object: its spec, by UID and generation.
// The status and metadata writes that bump resourceVersion (the status controller updates every
// policy's VMI count as VMIs are annotated) leave the prepared set as it is. The zero value
// stands for no object.
type specVersion struct {
	uid        types.UID
	generation int64
}

func specVersionOf(o *unstructured.Unstructured) specVersion {
	if o == nil {
		return specVersion{}
	}
	return specVersion{uid: o.GetUID(), generation: o.GetGeneration()}
}
