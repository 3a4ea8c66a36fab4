package engine

import (
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestDecodePoolPlanAsThroughJSON: the plan's decoder gives what decoding the whole value
// through JSON text gives, VMs included (numbers as float64, nulls, lists of maps).
func TestDecodePoolPlanAsThroughJSON(t *testing.T) {
	for name, doc := range map[string]string{
		"plan": `{
			"create": [{"name": "p-1", "vm": {"metadata": {"name": "p-1", "labels": {"a": "b"}}, "spec": {"running": true, "n": 3, "f": 1.5, "big": 12345678901234567890, "none": null, "list": [1, {"x": [2.5, null]}]}}, "reuse": ["dv-1"]},
			           {"name": "p-2", "vm": null, "reuse": []}],
			"delete": [{"name": "p-9", "preserveState": true, "volumes": ["root-9"]}],
			"update": [{"name": "p-3", "vm": {"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2}}}}}}}],
			"restart": ["p-3"], "reprovision": [{"name": "p-4", "volumes": []}], "reclaim": [{"volume": "dv-5", "vm": "p-5"}],
			"requeueAfterSeconds": 10, "status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 1, "labelSelector": "a=b"},
			"conditions": [{"type": "Scaled", "status": "True", "reason": "ReplicasMatch", "message": "3 of 3 VMs"}],
			"reprovisions": [{"name": "p-4", "count": 2, "lastTime": "2026-01-01T00:00:00Z"}]
		}`,
		"errors": `{"errors": ["spec.replicas: -1 must be an integer >= 0"]}`,
		"empty":  `{"create": [], "update": [], "requeueAfterSeconds": null}`,
	} {
		t.Run(name, func(t *testing.T) {
			term := ast.MustParseTerm(doc)
			var want poolPlanDecision
			if err := decode(term, &want); err != nil {
				t.Fatal(err)
			}
			got, err := decodePoolPlan(term)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v\nwant %+v", got, want)
			}
		})
	}
	for _, bad := range []string{`[]`, `{"create": [1]}`, `{"update": [{"vm": "x"}]}`} {
		if _, err := decodePoolPlan(ast.MustParseTerm(bad)); err == nil {
			t.Errorf("%s: decoded", bad)
		}
	}
}
