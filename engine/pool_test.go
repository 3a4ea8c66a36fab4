package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
)

func poolObject(spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "pool.virt-rules.io/v1alpha1", "kind": "VirtualMachinePool",
		"metadata": map[string]any{"name": "web", "namespace": "prod", "uid": "u"},
		"spec":     spec,
	}}
}

func TestPoolPlanNamesAndRequeue(t *testing.T) {
	eng, err := engine.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pool := poolObject(map[string]any{"replicas": int64(3), "template": map[string]any{"spec": map[string]any{"running": false}}})
	plan, err := eng.PoolPlan(context.Background(), engine.PoolInput{Pool: pool, Now: time.Now(), BurstLimit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Create) != 2 || plan.Create[0].Name != "web-1" || plan.Create[1].Name != "web-2" {
		t.Fatalf("create %+v, want web-1, web-2 (burst 2)", plan.Create)
	}
	if got := plan.Create[0].VM["metadata"].(map[string]any)["namespace"]; got != "prod" {
		t.Errorf("created VM's namespace %v, want prod", got)
	}
	if plan.RequeueAfter == nil || *plan.RequeueAfter != 0 {
		t.Errorf("requeue after %v, want at once (burst limit reached)", plan.RequeueAfter)
	}
	if plan.Revision == "" || plan.Status.LabelSelector != "pool.virt-rules.io/pool=web" {
		t.Errorf("revision %q, status %+v", plan.Revision, plan.Status)
	}
}

// The input's semantics override the bundle's setting for one plan: KubeVirt's names start at 0.
func TestPoolPlanSemantics(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool := poolObject(map[string]any{"replicas": int64(1), "template": map[string]any{"spec": map[string]any{}}})
	for semantics, want := range map[string]string{"": "web-1", "default": "web-1", "kubevirt": "web-0"} {
		plan, err := eng.PoolPlan(ctx, engine.PoolInput{Pool: pool, Now: time.Now(), Semantics: semantics})
		if err != nil {
			t.Fatalf("semantics %q: %v", semantics, err)
		}
		if len(plan.Create) != 1 || plan.Create[0].Name != want {
			t.Errorf("semantics %q: create %+v, want %s", semantics, plan.Create, want)
		}
	}
	if _, err := eng.PoolPlan(ctx, engine.PoolInput{Pool: pool, Now: time.Now(), Semantics: "newest"}); err == nil || !strings.Contains(err.Error(), "semantics: newest") {
		t.Errorf("semantics newest: err %v, want it named", err)
	}
}

func TestPoolPlanErrors(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad := poolObject(map[string]any{
		"replicas":        int64(1),
		"template":        map[string]any{"spec": map[string]any{}},
		"scaleInStrategy": map[string]any{"proactive": map[string]any{"statePreservation": "Online"}},
	})
	_, err = eng.PoolPlan(ctx, engine.PoolInput{Pool: bad, Now: time.Now()})
	var fe *engine.FieldError
	if !errors.Is(err, engine.ErrMalformedInput) || !errors.As(err, &fe) {
		t.Fatalf("err %v, want a FieldError", err)
	}
	if fe.Field != "spec.scaleInStrategy.proactive.statePreservation" || !strings.Contains(err.Error(), "VirtualMachinePool prod/web") {
		t.Errorf("err %v: want the field and the pool named", err)
	}
	good := poolObject(map[string]any{"replicas": int64(1), "template": map[string]any{"spec": map[string]any{}}})
	for name, in := range map[string]engine.PoolInput{
		"no pool":        {Now: time.Now()},
		"no time":        {Pool: good},
		"negative burst": {Pool: good, Now: time.Now(), BurstLimit: -1},
	} {
		if _, err := eng.PoolPlan(ctx, in); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
