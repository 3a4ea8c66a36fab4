package migrationpolicy

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
)

// PolicyIndex is an engine.MigrationPolicyIndex fed by the manager's informer of
// MigrationPolicies: the webhook reads the policies of one selector key from it instead of
// listing, keying and bucketing every policy for each admission.
type PolicyIndex struct {
	index  *engine.MigrationPolicyIndex
	synced func() bool
}

// WatchPolicies feeds index from informers' MigrationPolicies, from now on (before or after
// the informers start).
func WatchPolicies(ctx context.Context, informers cache.Informers, index *engine.MigrationPolicyIndex) (*PolicyIndex, error) {
	inf, err := informers.GetInformer(ctx, kinds.NewObject(GVKMigrationPolicy), cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("watch migration policies: %w", err)
	}
	upsert := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			index.Upsert(u)
		}
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
				index.Delete(u.GetName())
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watch migration policies: %w", err)
	}
	return &PolicyIndex{index: index, synced: reg.HasSynced}, nil
}

// SameKey is the stored policies of selector key with their keys
// (engine.MigrationPolicyIndex.SameKey), once the index holds every policy the informer first
// listed; it waits for that as long as ctx lets it.
func (p *PolicyIndex) SameKey(ctx context.Context, key string) ([]engine.KeyedMigrationPolicy, error) {
	if err := p.waitSynced(ctx); err != nil {
		return nil, err
	}
	return p.index.SameKey(ctx, key)
}

// All is every stored policy, once synced.
func (p *PolicyIndex) All(ctx context.Context) ([]*unstructured.Unstructured, error) {
	if err := p.waitSynced(ctx); err != nil {
		return nil, err
	}
	return p.index.All(), nil
}

func (p *PolicyIndex) waitSynced(ctx context.Context) error {
	if p.synced() {
		return nil
	}
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) { return p.synced(), nil })
	if err != nil {
		return fmt.Errorf("wait for the MigrationPolicies to be listed: %w", err)
	}
	return nil
}
