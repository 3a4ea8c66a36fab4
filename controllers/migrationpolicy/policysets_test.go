package migrationpolicy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
)

// countingReader counts the lists it serves.
type countingReader struct {
	client.Reader
	lists atomic.Int64
}

func (c *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.lists.Add(1)
	return c.Reader.List(ctx, list, opts...)
}

func setsPolicy(name, app string) *unstructured.Unstructured {
	u := kinds.NewObject(GVKMigrationPolicy)
	u.SetName(name)
	_ = unstructured.SetNestedStringMap(u.Object, map[string]string{"app": app}, "spec", "selectors", "virtualMachineInstanceSelector")
	return u
}

// Unwatched, every Current lists the policies and the KubeVirt CR; watched, only the first and
// those after an event (from the informers or Changed), and a new policy is decided with
// once an event says so: an informer's event has the set prepared before a decision asks.
func TestPolicySetsListAfterEventsOnly(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithObjects(setsPolicy("web", "web")).Build()
	subject := engine.MigrationPolicySubject{Namespace: "ns", Name: "vmi", Labels: map[string]string{"app": "db"}}
	decide := func(t *testing.T, p *PolicySets) string {
		t.Helper()
		set, err := p.Current(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d, err := set.Decide(ctx, subject)
		if err != nil {
			t.Fatal(err)
		}
		return d.Policy
	}

	t.Run("unwatched", func(t *testing.T) {
		reader := &countingReader{Reader: c}
		p := &PolicySets{Client: reader, Engine: eng}
		first, _ := p.Current(ctx)
		second, _ := p.Current(ctx)
		if n := reader.lists.Load(); n != 4 || first != second {
			t.Errorf("%d lists for two calls, the same set %v; want 4 and the same set", n, first == second)
		}
	})

	t.Run("watched", func(t *testing.T) {
		reader := &countingReader{Reader: c}
		p := &PolicySets{Client: reader, Engine: eng}
		informers := &informertest.FakeInformers{}
		if err := p.Watch(ctx, informers); err != nil {
			t.Fatal(err)
		}
		first, _ := p.Current(ctx)
		second, _ := p.Current(ctx)
		if n := reader.lists.Load(); n != 2 || first != second {
			t.Fatalf("%d lists for two calls without an event, the same set %v; want 2 and the same set", n, first == second)
		}
		if got := decide(t, p); got != "" {
			t.Fatalf("decided %q before the db policy exists", got)
		}
		db := setsPolicy("db", "db")
		if err := c.Create(ctx, db); err != nil {
			t.Fatal(err)
		}
		if got := decide(t, p); got != "" || reader.lists.Load() != 2 {
			t.Fatalf("decided %q after %d lists with no event yet; want the set as it was, 2 lists", got, reader.lists.Load())
		}
		inf, err := informers.FakeInformerFor(ctx, kinds.NewObject(GVKMigrationPolicy))
		if err != nil {
			t.Fatal(err)
		}
		inf.Add(db)
		// The event has the set prepared in the background: listed once more, and ready
		// before any decision asks for it.
		prepared := func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.seen == p.changes.Load()
		}
		for deadline := time.Now().Add(10 * time.Second); !prepared(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("10 s after the informer's event, the set is not prepared for it")
			}
		}
		if got := decide(t, p); got != "db" || reader.lists.Load() != 4 {
			t.Fatalf("decided %q after the informer's event and %d lists; want db, 4 lists (the event's preparation)", got, reader.lists.Load())
		}
		p.Changed() // a status write: listed again, the same set kept
		set, _ := p.Current(ctx)
		again, _ := p.Current(ctx)
		if set != again || reader.lists.Load() != 6 {
			t.Errorf("after Changed: %d lists, the same set %v; want 6 and the same set", reader.lists.Load(), set == again)
		}
	})
}
