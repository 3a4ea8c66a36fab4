package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// MigrationPolicyIndex holds stored MigrationPolicies by their selector key (the validation
// package's selector_keys), kept up to date one change at a time (Upsert, Delete: an informer's
// events), so that an admission reads only the policies its own key compares it with: its cost
// does not grow with the number of policies, where listing, keying and bucketing every policy
// for each admission (ExistingMigrationPolicies) does. Keys are computed for the active bundle
// when asked for, in one evaluation for every policy changed since, and for all of them again
// after the bundle changes. Safe for concurrent use; the caller must not modify a policy after
// handing it over.
type MigrationPolicyIndex struct {
	e *Engine

	mu       sync.Mutex
	policies map[string]*indexedPolicy // by name
	gen      *generation               // the generation the keys below are for
	buckets  map[string]map[string]*indexedPolicy
	unkeyed  map[string]*indexedPolicy // by name: key not computed for gen yet
}

type indexedPolicy struct {
	obj *unstructured.Unstructured
	key selectorKey // for the index's gen, once computed
}

// NewMigrationPolicyIndex is an empty index of MigrationPolicies validated by e.
func (e *Engine) NewMigrationPolicyIndex() *MigrationPolicyIndex {
	return &MigrationPolicyIndex{
		e:        e,
		policies: map[string]*indexedPolicy{},
		buckets:  map[string]map[string]*indexedPolicy{},
		unkeyed:  map[string]*indexedPolicy{},
	}
}

// Upsert adds policy, or replaces the one of its name.
func (x *MigrationPolicyIndex) Upsert(policy *unstructured.Unstructured) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeLocked(policy.GetName())
	p := &indexedPolicy{obj: policy}
	x.policies[policy.GetName()] = p
	x.unkeyed[policy.GetName()] = p
}

// Delete removes the policy named name, if present.
func (x *MigrationPolicyIndex) Delete(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeLocked(name)
}

func (x *MigrationPolicyIndex) removeLocked(name string) {
	p, ok := x.policies[name]
	if !ok {
		return
	}
	delete(x.policies, name)
	if _, ok := x.unkeyed[name]; ok {
		delete(x.unkeyed, name)
		return
	}
	if p.key.ok {
		b := x.buckets[p.key.key]
		delete(b, name)
		if len(b) == 0 {
			delete(x.buckets, p.key.key)
		}
	}
}

// Len is the number of policies held.
func (x *MigrationPolicyIndex) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.policies)
}

// All is every policy held, sorted by name.
func (x *MigrationPolicyIndex) All() []*unstructured.Unstructured {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]*unstructured.Unstructured, 0, len(x.policies))
	for _, p := range x.policies {
		out = append(out, p.obj)
	}
	sortByName(out)
	return out
}

// SameKey is every policy held whose selector key, under the active bundle, is key (as
// MigrationPolicyComparisonKey says it for the policy validated), sorted by name, each with its
// key and the bundle generation that keyed it: the policies that policy's validation compares it
// with, keyed already (NewKeyedMigrationPolicies). Under a bundle without selector_keys, every
// policy, all of key "".
func (x *MigrationPolicyIndex) SameKey(ctx context.Context, key string) ([]KeyedMigrationPolicy, error) {
	g := x.e.active.Load()
	if _, ok := g.queries[entryMigrationPolicySelectorKeys]; !ok {
		all := x.All()
		out := make([]KeyedMigrationPolicy, len(all))
		for i, p := range all {
			out[i] = KeyedMigrationPolicy{Policy: p, Key: comparisonKey(g, selectorKey{ok: true})}
		}
		return out, nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.keyLocked(ctx, g); err != nil {
		return nil, err
	}
	out := make([]KeyedMigrationPolicy, 0, len(x.buckets[key]))
	for _, p := range x.buckets[key] {
		out = append(out, KeyedMigrationPolicy{Policy: p.obj, Key: comparisonKey(g, p.key)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Policy.GetName() < out[j].Policy.GetName() })
	return out, nil
}

// keyLocked computes the keys of the policies that have none for g (all of them when g is new
// to the index), in one evaluation, and buckets them.
func (x *MigrationPolicyIndex) keyLocked(ctx context.Context, g *generation) error {
	if x.gen != g {
		x.gen = g
		x.buckets = map[string]map[string]*indexedPolicy{}
		for name, p := range x.policies {
			x.unkeyed[name] = p
		}
	}
	if len(x.unkeyed) == 0 {
		return nil
	}
	pending := make([]*indexedPolicy, 0, len(x.unkeyed))
	terms := make([]*ast.Term, 0, len(x.unkeyed))
	for _, p := range x.unkeyed {
		t, err := objectTerm(p.obj)
		if err != nil {
			return fmt.Errorf("key MigrationPolicy %s: %w", p.obj.GetName(), err)
		}
		pending = append(pending, p)
		terms = append(terms, t)
	}
	keys, err := evalSelectorKeys(ctx, g, terms)
	if err != nil {
		return fmt.Errorf("key %d MigrationPolicies: %w", len(terms), err)
	}
	for i, p := range pending {
		p.key = keys[i]
		if p.key.ok {
			b := x.buckets[p.key.key]
			if b == nil {
				b = map[string]*indexedPolicy{}
				x.buckets[p.key.key] = b
			}
			b[p.obj.GetName()] = p
		}
	}
	clear(x.unkeyed)
	return nil
}

func sortByName(policies []*unstructured.Unstructured) {
	sort.Slice(policies, func(i, j int) bool { return policies[i].GetName() < policies[j].GetName() })
}
