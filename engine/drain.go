package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
// VMIs placed after it. One evaluation for the order; one over every node for each VMI of a
// shape not placed before (the target decision's shape: what it reads of a VMI and its pod),
// and for a VMI of a shape placed before one over the nodes that took a VMI since only, the
// other candidates handed over as they were scored, since the target decision judges each node
// on that node and the pods on it.
func (e *Engine) Drain(ctx context.Context, in DrainInput) (*DrainPreview, error) {
	return e.drain(ctx, in, false)
}

// drain is Drain; oneByOne asks about every node for every VMI (the tests' reference).
func (e *Engine) drain(ctx context.Context, in DrainInput, oneByOne bool) (*DrainPreview, error) {
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
	onDrained := make(map[string]bool, len(in.Drain))
	for _, name := range in.Drain {
		onDrained[name] = true
	}
	byKey := make(map[string]*unstructured.Unstructured, len(in.VMIs))
	sources := map[string]*ast.Term{} // the evacuees' launcher pods, as terms once
	sourcePods := ast.NewObject()
	for _, vmi := range in.VMIs {
		key := vmi.GetNamespace() + "/" + vmi.GetName()
		byKey[key] = vmi
		if node, _, _ := unstructured.NestedString(vmi.Object, "status", "nodeName"); !onDrained[node] {
			continue
		}
		source := SourceLauncherPod(vmi, in.Pods)
		st, err := objectTerm(source)
		if err != nil {
			return nil, fmt.Errorf("drain: VMI %s: source pod: %w", key, err)
		}
		sources[key] = st
		sourcePods.Insert(ast.StringTerm(key), st)
	}
	t, err := g.eval(ctx, entryMigrationDrainEvacuees, ast.NewObject(item("drain", drain), item("vmis", vmis),
		item("kubevirt", kubevirt), item("sourcePods", ast.NewTerm(sourcePods))))
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
	shapes := evacueeShapes(t)

	nodes, err := cordoned(in.Nodes, in.Drain)
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	p, err := newPlacements(nodes, in.Pods)
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
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
		ask, err := newPlacementAsk(vmi, sources[v.VMI], kubevirt)
		if err != nil {
			return nil, fmt.Errorf("drain: VMI %s: %w", v.VMI, err)
		}
		class := p.class(shapes[i], oneByOne)
		var placed *placement
		if class != nil && class.scores != nil {
			// A VMI of a shape placed before: only the nodes that took a VMI since are asked about.
			if placed, err = p.placeAgain(ctx, g, ask, class, v.Node); err != nil {
				return nil, fmt.Errorf("drain: VMI %s: %w", v.VMI, err)
			}
		}
		if placed == nil {
			if placed, err = p.place(ctx, g, ask, p.all(), ast.ArrayTerm(p.pods...), nil); err != nil {
				return nil, fmt.Errorf("drain: VMI %s: %w", v.VMI, err)
			}
		}
		if placed.Error != nil || placed.TargetNode == "" {
			v.Action = DrainStuck
			if placed.Error != nil {
				// The target decision names the migration; there is none yet, so the VMI.
				v.Reason = placed.Error.Reason
				v.Message = "VMI " + v.VMI + ": " + strings.TrimPrefix(placed.Error.Message, "migration "+v.VMI+": ")
			}
			if class != nil {
				class.scores = nil
			}
			continue
		}
		v.TargetNode, v.CandidateNodes = placed.TargetNode, placed.CandidateNodes
		if class != nil {
			class.scores, class.seen = placed.scores, len(p.targets)
		}
		if err := p.take(vmi, placed); err != nil {
			return nil, fmt.Errorf("drain: VMI %s: target pod: %w", v.VMI, err)
		}
	}
	return preview, nil
}

// evacueeShapes is each evacuee's shape (nil where the decision gives none: not migrating, or
// a bundle from before shapes).
func evacueeShapes(t *ast.Term) []*ast.Term {
	arr, ok := t.Value.(*ast.Array)
	if !ok {
		return nil
	}
	shapes := make([]*ast.Term, arr.Len())
	for i := range arr.Len() {
		if obj, ok := arr.Elem(i).Value.(ast.Object); ok {
			shapes[i] = obj.Get(ast.StringTerm("shape"))
		}
	}
	return shapes
}

// placementAsk is what the placement of one VMI reads beside the nodes and pods.
type placementAsk struct {
	migration, vmi, sourcePod, kubevirt *ast.Term
}

func newPlacementAsk(vmi *unstructured.Unstructured, sourcePod, kubevirt *ast.Term) (placementAsk, error) {
	vt, err := objectTerm(vmi)
	if err != nil {
		return placementAsk{}, err
	}
	mt, err := objectTerm(unconstrainedMigration(vmi))
	if err != nil {
		return placementAsk{}, err
	}
	return placementAsk{migration: mt, vmi: vt, sourcePod: sourcePod, kubevirt: kubevirt}, nil
}

// placement is the placement decision's answer for one VMI.
type placement struct {
	TargetNode     string                `json:"targetNode"`
	CandidateNodes []string              `json:"candidateNodes"`
	Requested      map[string]int64      `json:"requested"`
	Error          *MigrationTargetError `json:"error"`
	// scores are the candidates as the decision scored them, [score, name] each; nil from a
	// bundle that gives none.
	scores []*ast.Term
}

// shapeClass is what the preview keeps of the last VMI placed of one shape: its candidates'
// scores, and how many VMIs had been placed before it (those after it changed their nodes).
type shapeClass struct {
	shape  *ast.Term
	scores []*ast.Term
	seen   int
}

// placements is the cluster as the evacuees placed so far leave it.
type placements struct {
	nodes  []*ast.Term
	byName map[string]*ast.Term
	// pods are every pod, the placed VMIs' target pods after the cluster's own; podsOn by node.
	pods    []*ast.Term
	podsOn  map[string][]*ast.Term
	targets []string // the target node of each VMI placed, in order
	classes map[int][]*shapeClass
}

func newPlacements(nodes *ast.Term, pods []*unstructured.Unstructured) (*placements, error) {
	arr, ok := nodes.Value.(*ast.Array)
	if !ok {
		return nil, errors.New("nodes: not a list")
	}
	p := &placements{byName: make(map[string]*ast.Term, arr.Len()), podsOn: map[string][]*ast.Term{},
		pods: make([]*ast.Term, 0, len(pods)), classes: map[int][]*shapeClass{}}
	for i := range arr.Len() {
		n := arr.Elem(i)
		p.nodes = append(p.nodes, n)
		if obj, ok := n.Value.(ast.Object); ok {
			p.byName[nodeName(obj)] = n
		}
	}
	for _, pod := range pods {
		pt, err := objectTerm(pod)
		if err != nil {
			return nil, err
		}
		p.pods = append(p.pods, pt)
		node, _, _ := unstructured.NestedString(pod.Object, "spec", "nodeName")
		p.podsOn[node] = append(p.podsOn[node], pt)
	}
	return p, nil
}

func (p *placements) all() *ast.Term { return ast.ArrayTerm(p.nodes...) }

// class is the shape's class, created on first sight; nil without a shape or one by one.
func (p *placements) class(shape *ast.Term, oneByOne bool) *shapeClass {
	if shape == nil || oneByOne {
		return nil
	}
	h := shape.Hash()
	for _, c := range p.classes[h] {
		if c.shape.Equal(shape) {
			return c
		}
	}
	c := &shapeClass{shape: shape}
	p.classes[h] = append(p.classes[h], c)
	return c
}

// place asks the placement decision about nodes, with pods and the candidates scored before.
func (p *placements) place(ctx context.Context, g *generation, ask placementAsk, nodes, pods *ast.Term, scored []*ast.Term) (*placement, error) {
	input := ast.NewObject(item("migration", ask.migration), item("vmi", ask.vmi), item("nodes", nodes),
		item("pods", pods), item("sourcePod", ask.sourcePod), item("kubevirt", ask.kubevirt))
	if scored != nil {
		input.Insert(ast.StringTerm("scored"), ast.ArrayTerm(scored...))
	}
	t, err := g.eval(ctx, entryMigrationDrainPlacement, input)
	if err != nil {
		return nil, err
	}
	placed := &placement{}
	if err := decode(t, placed); err != nil {
		return nil, fmt.Errorf("decode %s: %w", entryMigrationDrainPlacement, err)
	}
	if obj, ok := t.Value.(ast.Object); ok {
		if s := obj.Get(ast.StringTerm("scores")); s != nil {
			if arr, ok := s.Value.(*ast.Array); ok {
				placed.scores = make([]*ast.Term, 0, arr.Len())
				arr.Foreach(func(x *ast.Term) { placed.scores = append(placed.scores, x) })
			}
		}
	}
	return placed, nil
}

// placeAgain places a VMI of class's shape asking only about the nodes that took a VMI since
// the class's last one (and the VMI's own node, which the target decision reads), the other
// candidates handed over as scored. nil, and no error, when that leaves no candidate: the
// full ask then words why.
func (p *placements) placeAgain(ctx context.Context, g *generation, ask placementAsk, class *shapeClass, source string) (*placement, error) {
	changed := map[string]bool{}
	for _, name := range p.targets[class.seen:] {
		changed[name] = true
	}
	scored := make([]*ast.Term, 0, len(class.scores))
	for _, s := range class.scores {
		if arr, ok := s.Value.(*ast.Array); ok && arr.Len() == 2 {
			if name, ok := arr.Elem(1).Value.(ast.String); ok && !changed[string(name)] {
				scored = append(scored, s)
			}
		}
	}
	own, ok := p.byName[source]
	if !ok {
		return nil, nil
	}
	nodes := []*ast.Term{own}
	var pods []*ast.Term
	pods = append(pods, p.podsOn[source]...)
	for _, name := range slices.Sorted(maps.Keys(changed)) {
		if n, ok := p.byName[name]; ok && name != source {
			nodes = append(nodes, n)
			pods = append(pods, p.podsOn[name]...)
		}
	}
	placed, err := p.place(ctx, g, ask, ast.ArrayTerm(nodes...), ast.ArrayTerm(pods...), scored)
	if err != nil || placed.Error != nil || placed.TargetNode == "" || placed.scores == nil {
		return nil, err
	}
	return placed, nil
}

// take gives the placed VMI's target pod to its target node, for the VMIs placed after it.
func (p *placements) take(vmi *unstructured.Unstructured, placed *placement) error {
	target, err := objectTerm(targetPod(vmi, placed.TargetNode, placed.Requested))
	if err != nil {
		return err
	}
	p.pods = append(p.pods, target)
	p.podsOn[placed.TargetNode] = append(p.podsOn[placed.TargetNode], target)
	p.targets = append(p.targets, placed.TargetNode)
	return nil
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
