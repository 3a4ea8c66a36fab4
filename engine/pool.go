package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// DefaultPoolBurstLimit is how many VMs one pass of the pool controller creates or updates at
// most, unless told otherwise (design 003: as KubeVirt's VMIReplicaSet BurstReplicas).
const DefaultPoolBurstLimit = 250

// PoolInput is what the pool plan reads. Objects are as the API server stores them.
type PoolInput struct {
	// Pool is the VirtualMachinePool (pool.virt-rules.io/v1alpha1).
	Pool *unstructured.Unstructured
	// VMs are the VirtualMachines of the pool's namespace that the pool owns or whose names
	// start with "<pool>-" (detached VMs hold their names).
	VMs []*unstructured.Unstructured
	// VMIs are the VirtualMachineInstances of those VMs.
	VMIs []*unstructured.Unstructured
	// Volumes are the DataVolumes of the namespace kept by Offline state preservation
	// (label pool.virt-rules.io/preserved), of any pool.
	Volumes []*unstructured.Unstructured
	// Now is the time the plan is for: autohealing backoff is measured against it.
	Now time.Time
	// BurstLimit caps the VMs created or updated by one plan; 0 means DefaultPoolBurstLimit.
	BurstLimit int
	// Semantics, when set ("default" or "kubevirt"), overrides the bundle's
	// settings.semantics for this plan: eval previews KubeVirt's own pool.kubevirt.io pools
	// with "kubevirt" whatever the bundle's own pools follow.
	Semantics string
}

// PoolPlan is what the pool controller does next for one pool. Lists are in the order to
// apply them.
type PoolPlan struct {
	// Create are the VMs to create, with the preserved volumes each takes back.
	Create []PoolCreate `json:"create"`
	// Delete are the VMs scale-in removes.
	Delete []PoolDelete `json:"delete"`
	// Update are the VMs to bring to the template (spec, labels, annotations).
	Update []PoolUpdate `json:"update"`
	// Restart are the VMs whose VMI must be restarted (after their update), sorted.
	Restart []string `json:"restart"`
	// Reprovision are the VMs autohealing deletes with their state, to be created afresh
	// under the same name.
	Reprovision []PoolReprovision `json:"reprovision"`
	// Reclaim are preserved volumes whose VM is back: they belong to it again.
	Reclaim []PoolReclaim `json:"reclaim"`
	// RequeueAfter is when to plan again even if nothing changes; nil: only on changes.
	RequeueAfter *time.Duration `json:"-"`
	// Status is what the pool's status counts.
	Status PoolStatus `json:"status"`
	// Conditions are the pool's Scaled, Updated and Ready conditions.
	Conditions []PoolCondition `json:"conditions"`
	// Reprovisions are the autohealing records the pool's status keeps.
	Reprovisions []PoolReprovisionRecord `json:"reprovisions"`
	// Revision is the bundle revision that decided.
	Revision string `json:"-"`
	// RequeueAfterSeconds is RequeueAfter as the decision gives it.
	RequeueAfterSeconds *float64 `json:"requeueAfterSeconds"`
}

// PoolCreate is one VM to create.
type PoolCreate struct {
	Name string         `json:"name"`
	VM   map[string]any `json:"vm"`
	// Reuse are the preserved DataVolumes of this name, reused by the new VM.
	Reuse []string `json:"reuse"`
}

// PoolDelete is one VM to delete and what becomes of its DataVolumes.
type PoolDelete struct {
	Name string `json:"name"`
	// PreserveState keeps Volumes (Offline state preservation) instead of deleting them.
	PreserveState bool     `json:"preserveState"`
	Volumes       []string `json:"volumes"`
}

// PoolUpdate is one VM to update to VM (spec, labels and annotations).
type PoolUpdate struct {
	Name string         `json:"name"`
	VM   map[string]any `json:"vm"`
}

// PoolReprovision is one VM to delete with its volumes, to be created again.
type PoolReprovision struct {
	Name    string   `json:"name"`
	Volumes []string `json:"volumes"`
}

// PoolReclaim gives a preserved volume back to its VM.
type PoolReclaim struct {
	Volume string `json:"volume"`
	VM     string `json:"vm"`
}

// PoolStatus are the counts of the pool's status.
type PoolStatus struct {
	Replicas        int32  `json:"replicas"`
	ReadyReplicas   int32  `json:"readyReplicas"`
	UpdatedReplicas int32  `json:"updatedReplicas"`
	LabelSelector   string `json:"labelSelector"`
}

// PoolCondition is one condition of the pool's status.
type PoolCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// PoolReprovisionRecord is how often a VM was re-provisioned in a row, and when last.
type PoolReprovisionRecord struct {
	Name     string    `json:"name"`
	Count    int32     `json:"count"`
	LastTime time.Time `json:"lastTime"`
}

// PoolPlan decides what to do next for in.Pool. An invalid pool is an error naming each
// field at fault (matching ErrMalformedInput); no plan is made for it.
func (e *Engine) PoolPlan(ctx context.Context, in PoolInput) (*PoolPlan, error) {
	if in.Pool == nil {
		return nil, errors.New("pool plan: no pool")
	}
	key := in.Pool.GetNamespace() + "/" + in.Pool.GetName()
	burst := in.BurstLimit
	if burst == 0 {
		burst = DefaultPoolBurstLimit
	}
	if burst < 0 {
		return nil, fmt.Errorf("VirtualMachinePool %s: burst limit %d: want at least 1", key, burst)
	}
	input, err := poolInput(in, burst, e.objects)
	if err != nil {
		return nil, fmt.Errorf("VirtualMachinePool %s: %w", key, err)
	}
	g := e.active.Load()
	t, err := g.eval(ctx, entryPoolPlan, input)
	if err != nil {
		return nil, fmt.Errorf("VirtualMachinePool %s: %w", key, err)
	}
	out, err := decodePoolPlan(t)
	if err != nil {
		return nil, fmt.Errorf("VirtualMachinePool %s: decode %s: %w", key, entryPoolPlan, err)
	}
	if len(out.Errors) > 0 {
		errs := make([]error, len(out.Errors))
		for i, msg := range out.Errors {
			errs[i] = fieldError(msg)
		}
		return nil, fmt.Errorf("VirtualMachinePool %s: %w", key, errors.Join(errs...))
	}
	plan := out.PoolPlan
	plan.Revision = g.revision
	if s := plan.RequeueAfterSeconds; s != nil {
		d := time.Duration(math.Max(*s, 0) * float64(time.Second))
		plan.RequeueAfter = &d
	}
	return &plan, nil
}

func poolInput(in PoolInput, burst int, cache *objectCache) (ast.Value, error) {
	b := newTermBuilder(cache)
	pool, err := b.object(in.Pool)
	if err != nil {
		return nil, err
	}
	terms := make([][2]*ast.Term, 0, 7)
	terms = append(terms, item("pool", pool))
	for _, list := range []struct {
		key  string
		objs []*unstructured.Unstructured
	}{{"vms", in.VMs}, {"vmis", in.VMIs}, {"volumes", in.Volumes}} {
		t, err := b.objects(list.objs)
		if err != nil {
			return nil, err
		}
		terms = append(terms, item(list.key, t))
	}
	now := in.Now
	if now.IsZero() {
		return nil, errors.New("no current time given")
	}
	terms = append(terms,
		item("now", ast.StringTerm(now.UTC().Format(time.RFC3339))),
		item("burstLimit", ast.IntNumberTerm(burst)),
	)
	if in.Semantics != "" {
		terms = append(terms, item("semantics", ast.StringTerm(in.Semantics)))
	}
	return ast.NewObject(terms...), nil
}

// poolPlanDecision is the plan decision's value: a plan, or errors.
type poolPlanDecision struct {
	PoolPlan
	Errors []string `json:"errors"`
}

// decodePoolPlan reads the plan decision's value. The VMs to create and update, most of it,
// are read from the AST with planReader (their VMs as encoding/json would give them, numbers
// as float64), without the JSON text between; the rest is decoded through JSON into the typed
// plan.
func decodePoolPlan(t *ast.Term) (poolPlanDecision, error) {
	var out poolPlanDecision
	doc, ok := t.Value.(ast.Object)
	if !ok {
		return out, fmt.Errorf("want an object, got %v", ast.ValueName(t.Value))
	}
	rest := ast.NewObject()
	doc.Foreach(func(k, v *ast.Term) {
		if !k.Equal(createKey) && !k.Equal(updateKey) {
			rest.Insert(k, v)
		}
	})
	v, err := ast.JSON(rest)
	if err != nil {
		return out, err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, err
	}
	r := &planReader{}
	present := r.objects(doc, "create", "", func(o ast.Object, p string) {
		out.Create = append(out.Create, PoolCreate{Name: r.string(o, "name", p), VM: r.vm(o, p), Reuse: r.strings(o, "reuse", p)})
	})
	out.Create = emptyIfNil(out.Create, present)
	present = r.objects(doc, "update", "", func(o ast.Object, p string) {
		out.Update = append(out.Update, PoolUpdate{Name: r.string(o, "name", p), VM: r.vm(o, p)})
	})
	out.Update = emptyIfNil(out.Update, present)
	return out, r.err
}

var createKey, updateKey = ast.StringTerm("create"), ast.StringTerm("update")

// vm is obj.vm as encoding/json would decode it: nil when missing or null, numbers as float64.
func (r *planReader) vm(obj ast.Object, path string) map[string]any {
	v := r.field(obj, "vm")
	if v == nil {
		return nil
	}
	x, err := jsonValueOf(v)
	if err != nil {
		r.fail(path+"vm", "JSON ("+err.Error()+")", v)
		return nil
	}
	vm, ok := x.(map[string]any)
	if !ok {
		r.fail(path+"vm", "an object", v)
	}
	return vm
}

// strings is obj[key], a list of strings: nil when missing or null, empty when empty.
func (r *planReader) strings(obj ast.Object, key, path string) []string {
	list := r.list(obj, key, path)
	if list == nil {
		return nil
	}
	out := make([]string, 0, list.Len())
	for i := range list.Len() {
		s, ok := list.Elem(i).Value.(ast.String)
		if !ok {
			r.fail(fmt.Sprintf("%s%s[%d]", path, key, i), "a string", list.Elem(i).Value)
			continue
		}
		out = append(out, string(s))
	}
	return out
}
