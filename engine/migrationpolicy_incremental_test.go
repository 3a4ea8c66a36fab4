package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// TestMigrationPolicyIncremental changes a policy set one step at a time (a policy added,
// updated, renamed or deleted, now and then the KubeVirt CR) as a controller sees it, and
// wants every set prepared from the last one's work to decide as the reference does.
func TestMigrationPolicyIncremental(t *testing.T) {
	const steps, vmisPerStep = 40, 40
	seed := *migrationPolicySeed
	t.Logf("seed %d (rerun with -migrationpolicy.seed=%d)", seed, seed)
	for _, mode := range []reference.Mode{reference.ModeDefault, reference.ModeKubeVirt} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			logs := &preparedLog{}
			eng, settings := precedenceEngine(t, mode, engine.WithLogger(slog.New(logs)))
			gen := &diffGen{r: rand.New(rand.NewPCG(seed, 7))}
			in := diffInput{Policies: gen.policies(diffMaxPolicies), KubeVirt: gen.kubevirt()}
			for step := range steps {
				mp, err := eng.MigrationPolicies(in.Policies, in.KubeVirt)
				if err != nil {
					t.Fatal(err)
				}
				ref, cluster := referenceInputs(t, in, settings)
				for i := range vmisPerStep {
					in.VMI = gen.vmi(fmt.Sprintf("vmi-%d-%d", step, i))
					got, err := mp.Decide(ctx, in.VMI)
					want := reference.Decide(ref, referenceVMI(in.VMI), settings, cluster)
					if err != nil || !sameDecision(got, want) {
						t.Errorf("step %d: VMI %s: engine %v (%v), reference %s", step, in.VMI.Key(), got, err, referenceText(want))
						reportDisagreement(t, eng, settings, in)
						return
					}
				}
				if got := logs.last(); step > 0 && step%10 != 0 && (got.entries == 0 || got.rules == 0) {
					t.Errorf("step %d: reused %+v: the set was prepared afresh", step, got)
				}
				in = changeOnePolicy(gen, in, step)
			}
		})
	}
}

// changeOnePolicy is in after one change: mostly one policy added, updated or deleted; every
// tenth step the KubeVirt CR.
func changeOnePolicy(gen *diffGen, in diffInput, step int) diffInput {
	policies := slices.Clone(in.Policies)
	fresh := gen.policies(1)[0]
	switch {
	case step%10 == 9:
		in.KubeVirt = gen.kubevirt()
	case step%3 == 0 || len(policies) < 2: // add
		fresh.SetName(fmt.Sprintf("added-%02d", step))
		policies = append(policies, fresh)
	case step%3 == 1: // update: another spec under the same name
		i := gen.r.IntN(len(policies))
		fresh.SetName(policies[i].GetName())
		policies[i] = fresh
	default: // delete
		i := gen.r.IntN(len(policies))
		policies = slices.Delete(policies, i, i+1)
	}
	in.Policies = policies
	return in
}

// TestMigrationPolicyIncrementalReuses wants one policy's change to reuse the work of every
// other policy: its index entry and its partially evaluated rules.
func TestMigrationPolicyIncrementalReuses(t *testing.T) {
	ctx := context.Background()
	logs := &preparedLog{}
	eng, err := engine.New(ctx, engine.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	policies, subjects := sparsePolicies(rand.New(rand.NewPCG(n, 1)), n)
	prepare := func(policies []*unstructured.Unstructured) *engine.MigrationPolicies {
		t.Helper()
		set, err := eng.MigrationPolicies(policies, benchKubeVirt())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := set.Decide(ctx, subjects[0]); err != nil {
			t.Fatal(err)
		}
		return set
	}
	prepare(policies)
	if got := logs.last(); got.entries != 0 || got.rules != 0 {
		t.Fatalf("the first set reused %+v", got)
	}
	updated := slices.Clone(policies)
	updated[100] = policyObject(policies[100].GetName(), map[string]any{"matchLabels": map[string]any{"app": "changed"}}, nil, nil)
	set := prepare(updated)
	// The changed policy has fewer labels: it moves in the precedence order, and with it the
	// policies between its old and new place change ids but not parts (all are in part 0..1).
	if got := logs.last(); got.entries != n-1 || got.rules < n-3 {
		t.Errorf("after one update reused %+v, want %d entries and at least %d policies' rules", got, n-1, n-3)
	}
	d, err := set.Decide(ctx, engine.MigrationPolicySubject{Namespace: "x", Name: "v", Labels: map[string]string{"app": "changed"}, NamespaceLabels: map[string]string{}})
	if err != nil || d.Policy != policies[100].GetName() {
		t.Errorf("decision after the update: %+v, %v; want policy %s", d, err, policies[100].GetName())
	}
	prepare(slices.Delete(slices.Clone(updated), 7, 8))
	if got := logs.last(); got.entries != n-1 || got.rules < n-5 {
		t.Errorf("after one delete reused %+v, want %d entries and at least %d policies' rules", got, n-1, n-5)
	}

	// The status controller writes every policy's status annotations (its VMI count), each
	// write a new resourceVersion (a status too, as another controller might); then one
	// policy's spec changes. Only that policy is prepared anew.
	for i, p := range policies {
		p.SetUID(types.UID(fmt.Sprintf("uid-%d", i)))
		p.SetResourceVersion("1")
	}
	prepare(policies)
	statused := make([]*unstructured.Unstructured, n)
	for i, p := range policies {
		statused[i] = p.DeepCopy()
		statused[i].SetResourceVersion("2")
		statused[i].SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "virt-rules-migrationpolicy-status"}})
		statused[i].SetAnnotations(map[string]string{engine.AnnotationPolicyVMIs: fmt.Sprint(i), engine.AnnotationPolicyValid: "true"})
		if err := unstructured.SetNestedField(statused[i].Object, int64(i), "status", "vmis"); err != nil {
			t.Fatal(err)
		}
	}
	statused[3] = policyObject(policies[3].GetName(), map[string]any{"matchLabels": map[string]any{"app": "other"}}, nil, nil)
	statused[3].SetUID(policies[3].GetUID())
	statused[3].SetResourceVersion("3")
	prepare(statused)
	if got := logs.last(); got.entries != n-1 || got.rules < n-5 {
		t.Errorf("after every status written and one spec changed reused %+v, want %d entries and at least %d policies' rules", got, n-1, n-5)
	}
}

// preparedLog keeps what the engine logs when it prepares a policy set.
type preparedLog struct {
	mu       sync.Mutex
	prepared []reusedCounts
}

type reusedCounts struct{ entries, rules int64 }

func (l *preparedLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *preparedLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *preparedLog) WithGroup(string) slog.Handler            { return l }
func (l *preparedLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "migration policies prepared" {
		return nil
	}
	var c reusedCounts
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "reusedEntries":
			c.entries = a.Value.Int64()
		case "reusedPartialRules":
			c.rules = a.Value.Int64()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.prepared = append(l.prepared, c)
	return nil
}

func (l *preparedLog) last() reusedCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.prepared) == 0 {
		return reusedCounts{-1, -1}
	}
	return l.prepared[len(l.prepared)-1]
}
