package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/virt-rules/virt-rules/internal/manifest"
)

// The fuzz targets of each decision's input conversion. Each reads a small YAML stream
// (seeds: testdata/fuzz/FuzzX, the project's examples among them), sorts its objects by kind
// as `virt-rules eval` does, and runs the decision's engine methods on them. Whatever the
// objects, a method never panics and answers exactly one of a decision or an error, and an
// error names the object decided for.

// Bounds of one fuzz input: a decision over a few objects, not a scale test.
const (
	fuzzMaxBytes   = 32 << 10
	fuzzMaxObjects = 16
)

var fuzzEngine = sync.OnceValues(func() (*Engine, error) { return New(context.Background()) })

func fuzzSetup(t *testing.T, data []byte) (*Engine, map[string][]*unstructured.Unstructured) {
	t.Helper()
	if len(data) > fuzzMaxBytes {
		t.Skip("bounded inputs")
	}
	e, err := fuzzEngine()
	if err != nil {
		t.Fatal(err)
	}
	objs, _ := manifest.Parse("fuzz.yaml", bytes.NewReader(data))
	if len(objs) > fuzzMaxObjects {
		t.Skip("bounded inputs")
	}
	byKind := map[string][]*unstructured.Unstructured{}
	for _, o := range objs {
		byKind[o.GetKind()] = append(byKind[o.GetKind()], o.Unstructured)
	}
	return e, byKind
}

func first(objs []*unstructured.Unstructured) *unstructured.Unstructured {
	if len(objs) == 0 {
		return nil
	}
	return objs[0]
}

// oneOf fails unless exactly one of decision and err is nil, and err names one of want.
func oneOf(t *testing.T, what string, decisionIsNil bool, err error, want ...string) {
	t.Helper()
	switch {
	case err == nil && decisionIsNil:
		t.Fatalf("%s: neither a decision nor an error", what)
	case err != nil && !decisionIsNil:
		t.Fatalf("%s: both a decision and an error: %v", what, err)
	case err != nil && !slices.ContainsFunc(want, func(w string) bool { return strings.Contains(err.Error(), w) }):
		t.Fatalf("%s: error names none of %q: %v", what, want, err)
	}
}

// FuzzObjectTerm: the Go→Rego term conversion of an object as decoded from JSON (what every
// decision's input is built of) never panics, and the term reads back as the same value.
func FuzzObjectTerm(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > fuzzMaxBytes {
			t.Skip("bounded inputs")
		}
		var obj map[string]any
		if err := utiljson.Unmarshal(data, &obj); err != nil || obj == nil {
			return
		}
		u := &unstructured.Unstructured{Object: obj}
		term, err := objectTerm(u)
		if err != nil {
			if !strings.Contains(err.Error(), "convert") {
				t.Fatalf("error does not say what failed: %v", err)
			}
			return
		}
		back, err := ast.JSON(term.Value)
		if err != nil {
			t.Fatalf("the term of %s does not read back: %v", data, err)
		}
		if !sameJSON(t, obj, back) {
			t.Fatalf("the term reads back as %v, want %v", back, obj)
		}
		vt, err := valueTerm(obj)
		if err != nil {
			t.Fatalf("valueTerm: %v", err)
		}
		if vt.Value.Compare(term.Value) != 0 {
			t.Fatalf("valueTerm %v and objectTerm %v differ", vt, term)
		}
		// The builder of large inputs (the pool's) gives the same value, twice in a row.
		b := newTermBuilder(nil)
		for range 2 {
			bt, err := b.object(u)
			if err != nil {
				t.Fatalf("termBuilder: %v", err)
			}
			if bt.Value.Compare(term.Value) != 0 {
				t.Fatalf("termBuilder %v and objectTerm %v differ", bt, term)
			}
		}
		if labels := u.GetLabels(); labels != nil {
			lt := labelsTerm(labels)
			if n := lt.Value.(ast.Object).Len(); n != len(labels) {
				t.Fatalf("labels term has %d labels, want %d", n, len(labels))
			}
		}
	})
}

// sameJSON compares two decoded JSON values as JSON numbers compare: by value.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	norm := func(v any) any {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("marshal %v: %v", v, err)
		}
		var out any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("unmarshal %s: %v", raw, err)
		}
		return out
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// FuzzMigrationPolicy: the MigrationPolicy decision, its explanation and the policies'
// validation, over the stream's MigrationPolicies, KubeVirt CR, Namespaces and VMIs.
func FuzzMigrationPolicy(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		e, in := fuzzSetup(t, data)
		ctx := context.Background()
		policies := in["MigrationPolicy"]
		names := map[string]bool{"": true}
		for _, p := range policies {
			names[p.GetName()] = true
		}
		set, err := e.MigrationPolicies(policies, first(in["KubeVirt"]))
		oneOf(t, "prepare", set == nil, err, "migration policies")
		if err != nil {
			return
		}
		namespaces := map[string]map[string]string{}
		for _, ns := range in["Namespace"] {
			namespaces[ns.GetName()] = ns.GetLabels()
		}
		for _, vmi := range in["VirtualMachineInstance"] {
			subject := MigrationPolicySubject{Namespace: vmi.GetNamespace(), Name: vmi.GetName(), Labels: vmi.GetLabels()}
			if labels, ok := namespaces[subject.Namespace]; ok {
				subject.NamespaceLabels = labels
			}
			d, err := set.Decide(ctx, subject)
			oneOf(t, "decide", d == nil, err, subject.Key())
			if d != nil && !names[d.Policy] {
				t.Fatalf("vmi %s: policy %q is none of the policies given", subject.Key(), d.Policy)
			}
			x, err := set.Explain(ctx, subject)
			oneOf(t, "explain", x == nil, err, subject.Key())
		}
		existing := e.ExistingMigrationPolicies(policies)
		for _, p := range policies {
			v, err := e.ValidateMigrationPolicyIn(ctx, p, existing)
			if err != nil && !strings.Contains(err.Error(), "MigrationPolicy "+p.GetName()) {
				t.Fatalf("validate: error does not name the policy: %v", err)
			}
			for _, violation := range v {
				if violation.Field == "" || violation.Message == "" {
					t.Fatalf("validate %s: violation without field or message: %+v", p.GetName(), violation)
				}
			}
		}
	})
}

// FuzzMigrationTarget: the migration target decision, its explanation, the added term's
// validation, the target pod's affinity and the first-scheduling affinity, over the stream's
// first VirtualMachineInstanceMigration, first VMI, Nodes, Pods and KubeVirt CR.
func FuzzMigrationTarget(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		e, in := fuzzSetup(t, data)
		ctx := context.Background()
		nodes := e.NewNodes()
		for _, n := range in["Node"] {
			if err := nodes.Upsert(n); err != nil {
				t.Fatalf("upsert node %s: %v", n.GetName(), err)
			}
		}
		vmi, kubevirt := first(in["VirtualMachineInstance"]), first(in["KubeVirt"])
		if vmi != nil {
			// A *FieldError is about the KubeVirt CR's knobs: the caller names the CR.
			_, err := e.SchedulingAffinity(ctx, vmi, kubevirt)
			if fe := (*FieldError)(nil); err != nil && !(errors.As(err, &fe) && fe.Field != "") && !strings.Contains(err.Error(), vmi.GetName()) {
				t.Fatalf("scheduling affinity: error names neither the VMI nor a field: %v", err)
			}
		}
		migration := first(in["VirtualMachineInstanceMigration"])
		if migration == nil {
			return
		}
		key := migration.GetNamespace() + "/" + migration.GetName()
		target := MigrationTargetInput{Migration: migration, VMI: vmi, KubeVirt: kubevirt, Nodes: nodes, Pods: in["Pod"]}
		if vmi != nil {
			target.SourcePod = SourceLauncherPod(vmi, in["Pod"])
		}
		d, err := e.MigrationTarget(ctx, target)
		oneOf(t, "decide", d == nil, err, key)
		if d != nil && (d.Error == nil) == (len(d.CandidateNodes) == 0) {
			t.Fatalf("migration %s: candidates %v with error %v: want exactly one", key, d.CandidateNodes, d.Error)
		}
		x, err := e.ExplainMigrationTarget(ctx, target)
		oneOf(t, "explain", x == nil, err, key)
		v, err := e.ValidateMigration(ctx, migration)
		if err != nil && !strings.Contains(err.Error(), key) {
			t.Fatalf("validate: error does not name migration %s: %v", key, err)
		}
		for _, violation := range v {
			if violation.Message == "" {
				t.Fatalf("validate %s: violation without a message: %+v", key, violation)
			}
		}
		// nil and no error: the migration adds no requirement.
		a, err := e.MigrationTargetPodAffinity(ctx, migration, nil)
		if err != nil && (a != nil || !strings.Contains(err.Error(), key)) {
			t.Fatalf("target pod affinity %v: error does not name migration %s: %v", a, key, err)
		}
	})
}

// FuzzNodeMigratability: the host-model migratability levels of the stream's Nodes.
func FuzzNodeMigratability(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		e, in := fuzzSetup(t, data)
		nodes := e.NewNodes()
		given := map[string]bool{}
		for _, n := range in["Node"] {
			if err := nodes.Upsert(n); err != nil {
				t.Fatalf("upsert node %s: %v", n.GetName(), err)
			}
			given[n.GetName()] = true
		}
		levels, err := nodes.Migratability(context.Background())
		oneOf(t, "migratability", levels == nil, err, "node")
		for name, level := range levels {
			if !given[name] || level < 0 || level > 100 {
				t.Fatalf("node %q: level %d: want a given node and 0..100", name, level)
			}
		}
	})
}

// FuzzPoolPlan: the VirtualMachinePool plan of the stream's first pool, over its VMs, VMIs
// and DataVolumes.
func FuzzPoolPlan(f *testing.F) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		e, in := fuzzSetup(t, data)
		pool := first(in["VirtualMachinePool"])
		if pool == nil {
			return
		}
		key := "VirtualMachinePool " + pool.GetNamespace() + "/" + pool.GetName()
		input := PoolInput{Pool: pool, VMs: in["VirtualMachine"], VMIs: in["VirtualMachineInstance"], Volumes: in["DataVolume"], Now: now, BurstLimit: 4}
		plan, err := e.PoolPlan(context.Background(), input)
		oneOf(t, "plan", plan == nil, err, key)
		if plan != nil && len(plan.Create)+len(plan.Update) > 4 {
			t.Fatalf("%s: %d creates and updates over the burst limit 4", key, len(plan.Create)+len(plan.Update))
		}
	})
}

// FuzzVMDefaults: the VM defaults plan and shape of the stream's first VirtualMachine or
// VirtualMachineInstance, in the cluster of its KubeVirt CR (the request the defaulter
// builds before it asks libvirt).
func FuzzVMDefaults(f *testing.F) {
	machines := Machines{"amd64": {"pc-q35-7.2", "q35", "pc-i440fx-7.2", "pc"}}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, in := fuzzSetup(t, data)
		ctx := context.Background()
		var cluster *VMCluster
		if kv := first(in["KubeVirt"]); kv != nil {
			var err error
			if cluster, err = NewVMCluster(kv.Object); err != nil {
				if !strings.Contains(err.Error(), "KubeVirt CR") {
					t.Fatalf("cluster: error does not name the KubeVirt CR: %v", err)
				}
				return
			}
		}
		for kind, path := range map[string][]string{"VirtualMachine": {"spec", "template", "spec"}, "VirtualMachineInstance": {"spec"}} {
			obj := first(in[kind])
			if obj == nil {
				continue
			}
			spec, _, _ := unstructured.NestedMap(obj.Object, path...)
			if spec == nil {
				continue
			}
			vc := VMContext{Cluster: cluster, NamespaceUID: "0c1b6d1e-5f0a-4c51-9a3b-7c2a1b3c4d5e", Request: "fuzz"}
			// The defaulter type-checks the object against KubeVirt's Go types first (FuzzService
			// holds it to naming the object's field); here an error names the decision.
			plan, err := e.PlanVMDefaultsIn(ctx, obj.Object, spec, machines, vc)
			oneOf(t, "plan", plan == nil, err, "vm defaults plan", "vm.defaults.plan")
			if plan == nil {
				continue
			}
			for _, fe := range append(append([]FieldError{}, plan.Errors...), plan.Unsupported...) {
				if fe.Field == "" || fe.Message == "" {
					t.Fatalf("plan: a field error without field or message: %+v", fe)
				}
			}
			shape, err := e.VMShapeIn(ctx, obj.Object, spec, vc)
			oneOf(t, "shape", shape == nil, err, "vm shape", "vm.defaults.shape")
		}
	})
}

// FuzzXMLTerm: libvirt's domain XML as a Rego term (what the defaults mapping reads).
func FuzzXMLTerm(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > fuzzMaxBytes {
			t.Skip("bounded inputs")
		}
		term, err := xmlTerm(data)
		if (term == nil) == (err == nil) {
			t.Fatalf("term %v, error %v: want exactly one", term, err)
		}
		// The scanner reads what it reads as encoding/xml does.
		if scanned, ok := scanXMLTerm(data); ok {
			decoded, err := decodeXMLTerm(data)
			if err != nil {
				t.Fatalf("the scanner read %q, encoding/xml refuses it: %v", data, err)
			}
			if scanned.Value.Compare(decoded.Value) != 0 {
				t.Fatalf("%q: the scanner reads %v, encoding/xml %v", data, scanned, decoded)
			}
		}
	})
}
