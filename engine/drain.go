package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The actions a drain preview gives an evacuee (DrainVMI.Action).
const (
	// DrainMigrate: KubeVirt live-migrates it, to TargetNode.
	DrainMigrate = "migrate"
	// DrainShutdown: its eviction stops it.
	DrainShutdown = "shutdown"
	// DrainExternal: KubeVirt leaves it to an external controller (evictionStrategy External).
	DrainExternal = "external"
	// DrainStuck: the drain cannot finish because of it (Reason says why).
	DrainStuck = "stuck"
)

// DrainInput is what a drain preview reads: the nodes drained, and the cluster they are in.
type DrainInput struct {
	// Drain are the names of the nodes drained.
	Drain []string
	// VMIs are every VirtualMachineInstance; those on the drained nodes are the evacuees.
	VMIs []*unstructured.Unstructured
	// Nodes are every node.
	Nodes *Nodes
	// Pods are the pods using the nodes' resources, the VMIs' launcher pods among them.
	Pods []*unstructured.Unstructured
	// KubeVirt is the cluster's KubeVirt CR (its eviction strategy), or nil.
	KubeVirt *unstructured.Unstructured
}

// DrainVMI is what draining its node does to one VMI.
type DrainVMI struct {
	VMI              string `json:"vmi"`
	Node             string `json:"node"`
	EvictionStrategy string `json:"evictionStrategy"`
	// Action is DrainMigrate, DrainShutdown, DrainExternal or DrainStuck.
	Action string `json:"action"`
	// TargetNode is where the preview places a migrating VMI; "" otherwise.
	TargetNode string `json:"targetNode"`
	// CandidateNodes are where it could go when its turn comes, sorted.
	CandidateNodes []string `json:"candidateNodes"`
	// Reason is a code for every action but a migration: NotLiveMigratable,
	// EvictionStrategyNone, EvictionStrategyExternal, UnknownEvictionStrategy, or the
	// migration target decision's (NoCapacity, NoMatchingNode, ConflictsWithVMConstraints, ...).
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// DrainPreview is what draining the nodes does to every VMI on them, in the order the
// preview places them.
type DrainPreview struct {
	VMIs []DrainVMI `json:"vmis"`
	// Revision is the bundle revision that decided.
	Revision string `json:"-"`
}

// Stuck is how many VMIs keep the drain from finishing.
func (p *DrainPreview) Stuck() int {
	n := 0
	for _, v := range p.VMIs {
		if v.Action == DrainStuck {
			n++
		}
	}
	return n
}

// Drain previews draining in.Drain: the migration.drain decision orders the VMIs on them and
// says what each one's eviction does; each VMI to migrate is then placed in turn by the
// decision's placement (the migration target decision on the migration KubeVirt's evacuation
// creates, the drained nodes cordoned), its target pod taking its node's capacity for the
// VMIs placed after it. One evaluation for the order, one per VMI migrating.
func (e *Engine) Drain(ctx context.Context, in DrainInput) (*DrainPreview, error) {
	if len(in.Drain) == 0 {
		return nil, errors.New("drain: no node to drain")
	}
	if in.Nodes == nil {
		return nil, errors.New("drain: no nodes")
	}
	g := e.active.Load()
	drained := make([]*ast.Term, len(in.Drain))
	for i, name := range in.Drain {
		drained[i] = ast.StringTerm(name)
	}
	drain := ast.ObjectTerm(item("nodes", ast.ArrayTerm(drained...)))
	vmis, err := objectsTerm(in.VMIs)
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	kubevirt, err := objectTerm(in.KubeVirt)
	if err != nil {
		return nil, fmt.Errorf("drain: KubeVirt CR: %w", err)
	}
	t, err := g.eval(ctx, entryMigrationDrainEvacuees, ast.NewObject(item("drain", drain), item("vmis", vmis), item("kubevirt", kubevirt)))
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	preview := &DrainPreview{Revision: g.revision}
	if err := decode(t, &preview.VMIs); err != nil {
		return nil, fmt.Errorf("drain: decode %s: %w", entryMigrationDrainEvacuees, err)
	}
	if preview.VMIs == nil {
		preview.VMIs = []DrainVMI{}
	}

	byKey := make(map[string]*unstructured.Unstructured, len(in.VMIs))
	for _, vmi := range in.VMIs {
		byKey[vmi.GetNamespace()+"/"+vmi.GetName()] = vmi
	}
	nodes, err := cordoned(in.Nodes, in.Drain)
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	// The pods as terms once; each placed VMI's target pod is added for the next.
	pods := make([]*ast.Term, 0, len(in.Pods)+len(preview.VMIs))
	for _, p := range in.Pods {
		pt, err := objectTerm(p)
		if err != nil {
			return nil, fmt.Errorf("drain: %w", err)
		}
		pods = append(pods, pt)
	}
	for i := range preview.VMIs {
		v := &preview.VMIs[i]
		v.CandidateNodes = []string{}
		if v.Action != DrainMigrate {
			continue
		}
		vmi := byKey[v.VMI]
		if vmi == nil {
			return nil, fmt.Errorf("drain: %s names VMI %s, not among the inputs", entryMigrationDrainEvacuees, v.VMI)
		}
		source := SourceLauncherPod(vmi, in.Pods)
		vt, err := objectTerm(vmi)
		if err != nil {
			return nil, fmt.Errorf("drain: %w", err)
		}
		st, err := objectTerm(source)
		if err != nil {
			return nil, fmt.Errorf("drain: VMI %s: source pod: %w", v.VMI, err)
		}
		mt, err := objectTerm(unconstrainedMigration(vmi))
		if err != nil {
			return nil, fmt.Errorf("drain: %w", err)
		}
		input := ast.NewObject(item("migration", mt), item("vmi", vt), item("nodes", nodes),
			item("pods", ast.ArrayTerm(pods...)), item("sourcePod", st), item("kubevirt", kubevirt))
		t, err := g.eval(ctx, entryMigrationDrainPlacement, input)
		if err != nil {
			return nil, fmt.Errorf("drain: VMI %s: %w", v.VMI, err)
		}
		var placed struct {
			TargetNode     string                `json:"targetNode"`
			CandidateNodes []string              `json:"candidateNodes"`
			Requested      map[string]int64      `json:"requested"`
			Error          *MigrationTargetError `json:"error"`
		}
		if err := decode(t, &placed); err != nil {
			return nil, fmt.Errorf("drain: VMI %s: decode %s: %w", v.VMI, entryMigrationDrainPlacement, err)
		}
		if placed.Error != nil || placed.TargetNode == "" {
			v.Action = DrainStuck
			if placed.Error != nil {
				// The target decision names the migration; there is none yet, so the VMI.
				v.Reason = placed.Error.Reason
				v.Message = "VMI " + v.VMI + ": " + strings.TrimPrefix(placed.Error.Message, "migration "+v.VMI+": ")
			}
			continue
		}
		v.TargetNode, v.CandidateNodes = placed.TargetNode, placed.CandidateNodes
		target, err := objectTerm(targetPod(vmi, placed.TargetNode, placed.Requested))
		if err != nil {
			return nil, fmt.Errorf("drain: VMI %s: target pod: %w", v.VMI, err)
		}
		pods = append(pods, target)
	}
	return preview, nil
}

// cordoned is every node as the placement reads it: the drained ones cordoned
// (spec.unschedulable, as kubectl drain leaves them), the others as they are.
func cordoned(nodes *Nodes, drain []string) (*ast.Term, error) {
	all, err := nodes.term()
	if err != nil {
		return nil, err
	}
	arr, ok := all.Value.(*ast.Array)
	if !ok {
		return nil, errors.New("nodes: not a list")
	}
	unschedulable, spec := ast.StringTerm("unschedulable"), ast.StringTerm("spec")
	terms := make([]*ast.Term, 0, arr.Len())
	for i := range arr.Len() {
		t := arr.Elem(i)
		if obj, ok := t.Value.(ast.Object); ok && slices.Contains(drain, nodeName(obj)) {
			cordon := ast.NewObject()
			if own := obj.Get(spec); own != nil {
				if o, ok := own.Value.(ast.Object); ok {
					cordon = o.Copy()
				}
			}
			cordon.Insert(unschedulable, ast.BooleanTerm(true))
			node := obj.Copy()
			node.Insert(spec, ast.NewTerm(cordon))
			t = ast.NewTerm(node)
		}
		terms = append(terms, t)
	}
	return ast.ArrayTerm(terms...), nil
}

// nodeName is a node term's metadata.name, or "".
func nodeName(node ast.Object) string {
	name, err := node.Find(ast.Ref{ast.StringTerm("metadata"), ast.StringTerm("name")})
	if s, ok := name.(ast.String); err == nil && ok {
		return string(s)
	}
	return ""
}

// targetPod stands for the target virt-launcher pod of vmi's migration on node: a pod whose
// pod-level requests (spec.resources, as kube-scheduler counts them when a pod has them) are
// what the placement said the target pod requests, in scheduler amounts (millicores of CPU,
// bytes, counts). That is all the capacity check of the evacuees placed after it reads of it,
// and each of their placements reads it again, so it carries nothing else of the source pod.
func targetPod(vmi *unstructured.Unstructured, node string, requested map[string]int64) *unstructured.Unstructured {
	requests := make(map[string]any, len(requested))
	for resource, amount := range requested {
		if resource == "cpu" {
			requests[resource] = strconv.FormatInt(amount, 10) + "m"
		} else {
			requests[resource] = strconv.FormatInt(amount, 10)
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"namespace": vmi.GetNamespace(), "name": vmi.GetName() + "-drain-target"},
		"spec": map[string]any{
			"nodeName":  node,
			"resources": map[string]any{"requests": requests},
		},
		"status": map[string]any{"phase": "Pending"},
	}}
}
