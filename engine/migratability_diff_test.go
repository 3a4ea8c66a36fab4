package engine_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The node migratability differential test generates clusters of several CPU generations,
// loads each into an engine.Nodes view, then changes it one node at a time (new nodes,
// relabelled nodes, cordons, deletions) and swaps the engine's bundle now and then. After
// the load and after (nearly) every change it wants Nodes.Migratability to equal the plain Go
// pairwise definition (reference.MigratabilityPairwise) of the cluster as it then is.

var (
	migratabilitySeed = flag.Uint64("migratability.seed", 2225777, "seed of the node migratability differential test")
	// The engine reads a node's labels with GetLabels, which drops every label of a node when
	// one value is not a string; the Rego ignores just that label. The API server never stores
	// such values and `eval` refuses them, so they are generated only on request.
	migratabilityNonString = flag.Bool("migratability.nonstring", false, "also generate label values that are not strings")
)

const (
	migClusters  = 80 // generated scenarios
	migSteps     = 30 // changes per scenario
	migMaxNodes  = 30
	migSwapEvery = 8 // every migSwapEvery-th scenario swaps the bundle midway
	// migratabilityModule is the decision's module in a bundle directory.
	migratabilityModule = "virtrules/node/migratability/migratability.rego"
)

func TestNodeMigratabilityDifferential(t *testing.T) {
	seed := *migratabilitySeed
	t.Logf("seed %d (rerun with -migratability.seed=%d)", seed, seed)
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gen := &migGen{r: rand.New(rand.NewPCG(seed, 2)), bundles: swapBundles(t), nonString: *migratabilityNonString}
	covered := map[string]int{}
	checks := 0
	var serving *migBundle // nil: the embedded bundle
	for i := range migClusters {
		sc := gen.scenario(i)
		sc.Bundle = serving
		f := runMigScenario(ctx, eng, sc, covered)
		if f != nil {
			reportMigDisagreement(t, eng, sc, f)
			return
		}
		checks++ // after the load
		for j, op := range sc.Ops {
			if op.Check || j == len(sc.Ops)-1 {
				checks++
			}
			if op.Swap != nil {
				serving = op.Swap
			}
		}
	}
	t.Logf("%d scenarios, %d comparisons: %v", migClusters, checks, covered)
	for _, what := range migWantCovered {
		if covered[what] == 0 {
			t.Errorf("no generated input exercised %q; the generator needs adjusting", what)
		}
	}
}

// swapBundles are two copies of the embedded bundle without its tests. The first renames
// the signature field "features" to "cpuFeatures" and adds a label prefix the signature does
// not read: the same levels, but a Nodes view that kept signatures or keys of the previous
// bundle would hand `levels` groups it rejects. The second is an unchanged copy.
func swapBundles(t *testing.T) []migBundle {
	t.Helper()
	renamed := bundleDir(t, func(dir string) {
		file := filepath.Join(dir, filepath.FromSlash(migratabilityModule))
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		for _, r := range [][2]string{
			{`"features"`, `"cpuFeatures"`},
			{`.features`, `.cpuFeatures`},
			{`[_schedulable_label],`, `[_schedulable_label, "cpu-model.node.kubevirt.io/"],`},
		} {
			if !strings.Contains(text, r[0]) {
				t.Fatalf("%s does not contain %q", file, r[0])
			}
			text = strings.ReplaceAll(text, r[0], r[1])
		}
		writeFile(t, file, text)
	})
	return []migBundle{{"renamed signature fields", renamed}, {"unchanged copy", bundleDir(t, nil)}}
}

type migBundle struct{ Name, Path string }

// migScenario is a cluster loaded at once, then changed one operation at a time.
type migScenario struct {
	// Bundle is the bundle the engine serves at the start; nil for the embedded one.
	Bundle *migBundle                   `json:"bundle,omitempty"`
	Nodes  []*unstructured.Unstructured `json:"nodes"`
	Ops    []migOp                      `json:"ops,omitempty"`
}

// migOp is one change: exactly one of Upsert, Delete and Swap.
type migOp struct {
	Kind   string                     `json:"kind"` // what the generator meant, for coverage
	Upsert *unstructured.Unstructured `json:"upsert,omitempty"`
	Delete string                     `json:"delete,omitempty"`
	Swap   *migBundle                 `json:"swap,omitempty"`
	// Check compares the levels after this operation (always after the last one).
	Check bool `json:"check"`
}

// migFailure is where a scenario first disagrees: after Step operations (0: the load).
type migFailure struct {
	Step int
	Msg  string
}

// runMigScenario replays sc on a new Nodes view of eng and returns the first disagreement,
// nil if none. covered (optional) counts what the scenario exercised.
func runMigScenario(ctx context.Context, eng *engine.Engine, sc migScenario, covered map[string]int) *migFailure {
	nodes := eng.NewNodes()
	cluster := map[string]*unstructured.Unstructured{}
	for _, n := range sc.Nodes {
		if err := nodes.Upsert(n); err != nil {
			return &migFailure{0, fmt.Sprintf("upsert %s: %v", n.GetName(), err)}
		}
		cluster[n.GetName()] = n
	}
	if msg := compareMigratability(ctx, nodes, cluster, covered); msg != "" {
		return &migFailure{0, msg}
	}
	for i, op := range sc.Ops {
		switch {
		case op.Swap != nil:
			if err := eng.LoadPath(ctx, op.Swap.Path); err != nil {
				return &migFailure{i + 1, fmt.Sprintf("swap to %s: %v", op.Swap.Name, err)}
			}
		case op.Upsert != nil:
			if err := nodes.Upsert(op.Upsert); err != nil {
				return &migFailure{i + 1, fmt.Sprintf("upsert %s: %v", op.Upsert.GetName(), err)}
			}
			cluster[op.Upsert.GetName()] = op.Upsert
		default:
			nodes.Delete(op.Delete)
			delete(cluster, op.Delete)
		}
		if covered != nil {
			covered["op: "+op.Kind]++
		}
		if op.Check || i == len(sc.Ops)-1 {
			if msg := compareMigratability(ctx, nodes, cluster, covered); msg != "" {
				return &migFailure{i + 1, msg}
			}
		}
	}
	return nil
}

// compareMigratability describes how the view's levels differ from the reference's, "" if
// they do not.
func compareMigratability(ctx context.Context, nodes *engine.Nodes, cluster map[string]*unstructured.Unstructured, covered map[string]int) string {
	objs := slices.Collect(maps.Values(cluster))
	ref := reference.NodesFromUnstructured(objs)
	want := reference.MigratabilityPairwise(ref)
	got, err := nodes.Migratability(ctx)
	if err != nil {
		return fmt.Sprintf("engine: %v\nreference: %v", err, want)
	}
	if covered != nil {
		coverMigratability(covered, ref, want)
	}
	if nodes.Len() != len(cluster) {
		return fmt.Sprintf("engine holds %d nodes, the cluster has %d", nodes.Len(), len(cluster))
	}
	if maps.Equal(got, want) {
		return ""
	}
	var diff []string
	for _, name := range slices.Sorted(maps.Keys(cluster)) {
		g, gok := got[name]
		w, wok := want[name]
		if g != w || gok != wok {
			diff = append(diff, fmt.Sprintf("  %s: engine %s, reference %s", name, levelText(g, gok), levelText(w, wok)))
		}
	}
	return "levels differ:\n" + strings.Join(diff, "\n")
}

func levelText(level int, ok bool) string {
	if !ok {
		return "no level"
	}
	return fmt.Sprint(level)
}

// coverMigratability counts which rules the cluster exercised.
func coverMigratability(covered map[string]int, nodes []reference.Node, levels map[string]int) {
	schedulable := 0
	for _, n := range nodes {
		if n.Schedulable() {
			schedulable++
		}
	}
	for _, n := range nodes {
		switch {
		case n.Unschedulable:
			covered["cordoned node"]++
		case !n.Schedulable():
			covered["kubevirt.io/schedulable=false"]++
		case len(n.LabelNames(reference.HostModelCPULabelPrefix)) > 1:
			covered["several host models"]++
		}
		if _, ok := n.HostModel(); ok && n.Schedulable() && !reference.CanMigrate(n, n) {
			covered["node is no destination for its own VMs"]++
		}
		level, ok := levels[n.Name]
		switch {
		case !ok:
		case schedulable == 1:
			covered["alone: level 0"]++
		case level == 0:
			covered["level 0"]++
		case level == 100:
			covered["level 100"]++
		default:
			covered["level between 0 and 100"]++
		}
	}
}

var migWantCovered = []string{
	"cordoned node", "kubevirt.io/schedulable=false", "several host models",
	"node is no destination for its own VMs", "alone: level 0", "level 0", "level 100",
	"level between 0 and 100",
	"op: add", "op: relabel", "op: flip a CPU label", "op: change other labels", "op: cordon",
	"op: uncordon", "op: disable", "op: enable", "op: delete", "op: delete missing",
	"op: unchanged", "op: swap bundle",
}

// reportMigDisagreement shrinks sc to a scenario that still disagrees, dropping one
// operation, node or label at a time, and reports it.
func reportMigDisagreement(t *testing.T, eng *engine.Engine, sc migScenario, f *migFailure) {
	t.Helper()
	ctx := context.Background()
	// A scenario that swaps bundles leaves the engine serving another one, so each replay of
	// such a scenario gets an engine of its own, serving the bundle the scenario starts with.
	replay := func(sc migScenario) *migFailure {
		e := eng
		if slices.ContainsFunc(sc.Ops, func(op migOp) bool { return op.Swap != nil }) {
			var opts []engine.Option
			if sc.Bundle != nil {
				opts = append(opts, engine.WithBundlePath(sc.Bundle.Path))
			}
			var err error
			if e, err = engine.New(ctx, opts...); err != nil {
				return &migFailure{0, err.Error()}
			}
		}
		return runMigScenario(ctx, e, sc, nil)
	}
	sc.Ops = sc.Ops[:f.Step]
	// Every candidate is strictly smaller, so this ends; the deadline bounds a slow engine.
	deadline := time.Now().Add(time.Minute)
	for shrunk := true; shrunk && time.Now().Before(deadline); {
		shrunk = false
		candidates := migShrinkCandidates(sc)
		for i := 0; i < len(candidates) && time.Now().Before(deadline); i++ {
			if g := replay(candidates[i]); g != nil {
				sc, f, shrunk = candidates[i], g, true
				sc.Ops = sc.Ops[:f.Step]
				// The candidate now at position i is the next one to try.
				candidates = migShrinkCandidates(sc)
				i--
			}
		}
	}
	for i := range sc.Ops {
		sc.Ops[i].Check = i == len(sc.Ops)-1
	}
	raw, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	t.Errorf("engine and reference disagree after %d operations; minimal scenario (nodes loaded at once, then ops in order):\n%s\n%s",
		f.Step, raw, f.Msg)
}

// migShrinkCandidates are the scenarios one step smaller than sc: without an operation, a
// node, a label or a spec.
func migShrinkCandidates(sc migScenario) []migScenario {
	var out []migScenario
	for i := range sc.Ops {
		smaller := sc
		smaller.Ops = slices.Delete(slices.Clone(sc.Ops), i, i+1)
		out = append(out, smaller)
	}
	for i := range sc.Nodes {
		smaller := sc
		smaller.Nodes = slices.Delete(slices.Clone(sc.Nodes), i, i+1)
		out = append(out, smaller)
	}
	for i, n := range sc.Nodes {
		for _, m := range smallerNodes(n) {
			smaller := sc
			smaller.Nodes = slices.Clone(sc.Nodes)
			smaller.Nodes[i] = m
			out = append(out, smaller)
		}
	}
	for i, op := range sc.Ops {
		if op.Upsert == nil {
			continue
		}
		for _, m := range smallerNodes(op.Upsert) {
			smaller := sc
			smaller.Ops = slices.Clone(sc.Ops)
			smaller.Ops[i].Upsert = m
			out = append(out, smaller)
		}
	}
	return out
}

// smallerNodes are n without one of its labels, or without its spec.
func smallerNodes(n *unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	if _, ok := n.Object["spec"]; ok {
		m := n.DeepCopy()
		delete(m.Object, "spec")
		out = append(out, m)
	}
	for _, key := range slices.Sorted(maps.Keys(migLabels(n))) {
		m := n.DeepCopy()
		delete(migLabels(m), key)
		out = append(out, m)
	}
	return out
}

// migLabels are n's labels as stored, to change in place (only on a fresh copy).
func migLabels(n *unstructured.Unstructured) map[string]any {
	metadata, _ := n.Object["metadata"].(map[string]any)
	labels, _ := metadata["labels"].(map[string]any)
	return labels
}

// Generated clusters. ----------------------------------------------------------------------

// Model and feature names as KubeVirt's node labeller reports them; models from old to new.
var (
	migModels = []string{
		"Penryn", "Nehalem", "Westmere", "SandyBridge", "IvyBridge", "Haswell", "Broadwell",
		"Skylake-Server", "Cascadelake-Server", "Icelake-Server", "SapphireRapids",
	}
	migFeatures = []string{
		"aes", "avx", "avx2", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl",
		"avx512vnni", "bmi1", "bmi2", "clflushopt", "clwb", "erms", "f16c", "fma", "fsgsbase",
		"gfni", "invpcid", "movbe", "pcid", "pclmuldq", "pku", "popcnt", "rdrand", "rdseed",
		"sha-ni", "smap", "smep", "sse4.1", "sse4.2", "ssse3", "vaes", "vpclmulqdq", "xsave",
	}
)

// migGeneration is a CPU generation: its host model, the models it can run, its features
// and what a host-model VM started on it requires.
type migGeneration struct {
	model    string
	models   []string
	features []string
	required []string
}

type migGen struct {
	r         *rand.Rand
	bundles   []migBundle
	nonString bool

	gens []migGeneration // of the current scenario
	seq  int             // node names
}

func (g *migGen) chance(p float64) bool { return g.r.Float64() < p }

// generations draws 3 to 5 consecutive models, 10 to 30 features, and gives each generation
// the features of the previous one (now and then minus one) plus new ones, the older models
// (now and then minus one, or minus its own), and some of its newest features as required.
func (g *migGen) generations() []migGeneration {
	n := 3 + g.r.IntN(3)
	first := g.r.IntN(len(migModels) - n + 1)
	pool := slices.Clone(migFeatures)
	g.r.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	pool = pool[:10+g.r.IntN(21)]
	per := len(pool) / n
	gens := make([]migGeneration, n)
	for k := range gens {
		gen := &gens[k]
		gen.model = migModels[first+k]
		if k > 0 {
			gen.features = slices.Clone(gens[k-1].features)
			if g.chance(0.2) {
				gen.features = slices.Delete(gen.features, 0, 1) // a feature dropped (TSX, say)
			}
		}
		added := pool[k*per : (k+1)*per]
		gen.features = append(gen.features, added...)
		for _, old := range migModels[first : first+k] {
			if !g.chance(0.15) {
				gen.models = append(gen.models, old)
			}
		}
		if !g.chance(0.1) {
			gen.models = append(gen.models, gen.model)
		}
		for _, f := range added {
			if g.chance(0.5) {
				gen.required = append(gen.required, f)
			}
		}
		if g.chance(0.3) {
			gen.required = append(gen.required, oneOf(g.r, gen.features))
		}
	}
	return gens
}

func (g *migGen) scenario(i int) migScenario {
	g.gens = g.generations()
	var n int
	switch x := g.r.IntN(10); {
	case x < 2:
		n = g.r.IntN(4) // 0 to 3 nodes
	default:
		n = 4 + g.r.IntN(migMaxNodes-3)
	}
	sc := migScenario{}
	var names []string
	for range n {
		node := g.node(g.newName())
		sc.Nodes = append(sc.Nodes, node)
		names = append(names, node.GetName())
	}
	current := func() *unstructured.Unstructured { // the latest version of a node
		name := oneOf(g.r, names)
		for j := len(sc.Ops) - 1; j >= 0; j-- {
			if u := sc.Ops[j].Upsert; u != nil && u.GetName() == name {
				return u
			}
		}
		for _, u := range sc.Nodes {
			if u.GetName() == name {
				return u
			}
		}
		panic("node " + name + " not generated")
	}
	swapAt := -1
	if i%migSwapEvery == migSwapEvery-1 {
		swapAt = g.r.IntN(migSteps)
	}
	for step := range migSteps {
		op := migOp{Check: !g.chance(0.15)}
		switch x := g.r.IntN(20); {
		case step == swapAt:
			b := g.bundles[(i/migSwapEvery)%len(g.bundles)]
			op.Kind, op.Swap, op.Check = "swap bundle", &b, true
		case len(names) == 0 || x < 4:
			op.Kind, op.Upsert = "add", g.node(g.newName())
			names = append(names, op.Upsert.GetName())
		case x < 6:
			op.Kind, op.Upsert = "relabel", g.node(current().GetName())
		case x < 8:
			op.Kind, op.Upsert = "flip a CPU label", g.flipCPULabel(current())
		case x < 9:
			op.Kind, op.Upsert = "change other labels", g.changeOtherLabels(current())
		case x < 11:
			op.Upsert = current().DeepCopy()
			if u, _, _ := unstructured.NestedBool(op.Upsert.Object, "spec", "unschedulable"); u {
				op.Kind = "uncordon"
				unstructured.RemoveNestedField(op.Upsert.Object, "spec", "unschedulable")
			} else {
				op.Kind = "cordon"
				_ = unstructured.SetNestedField(op.Upsert.Object, true, "spec", "unschedulable")
			}
		case x < 13:
			op.Upsert = current().DeepCopy()
			if labels := migLabels(op.Upsert); labels[reference.SchedulableLabel] == "false" {
				op.Kind = "enable"
				labels[reference.SchedulableLabel] = "true"
			} else {
				op.Kind = "disable"
				labels[reference.SchedulableLabel] = "false"
			}
		case x < 17:
			j := g.r.IntN(len(names))
			op.Kind, op.Delete = "delete", names[j]
			names = slices.Delete(names, j, j+1)
		case x < 18:
			op.Kind, op.Delete = "delete missing", "no-such-node"
		default:
			op.Kind, op.Upsert = "unchanged", current().DeepCopy()
		}
		sc.Ops = append(sc.Ops, op)
	}
	return sc
}

func (g *migGen) newName() string {
	g.seq++
	return fmt.Sprintf("node-%04d", g.seq)
}

// node is a node of a random generation of the scenario, with the labeller's labels and
// now and then something odd: a missing, "false" or extra label, two host models, a cordon.
func (g *migGen) node(name string) *unstructured.Unstructured {
	gen := oneOf(g.r, g.gens)
	labels := map[string]any{
		"kubernetes.io/hostname":                                   name,
		"kubernetes.io/os":                                         "linux",
		"cpu-model.node.kubevirt.io/" + gen.model:                  "true",
		"cpu-vendor.node.kubevirt.io/Intel":                        "true",
		"topology.kubernetes.io/zone":                              oneOf(g.r, []string{"a", "b", "c"}),
		reference.HostModelCPULabelPrefix + gen.model:              "true",
		"host-model-cpu.node.kubevirt.io.example.com/" + gen.model: "true", // a look-alike prefix
	}
	for _, m := range gen.models {
		labels[reference.CPUModelMigrationLabelPrefix+m] = "true"
	}
	for _, f := range gen.features {
		labels[reference.CPUFeatureLabelPrefix+f] = "true"
	}
	for _, f := range gen.required {
		labels[reference.HostModelRequiredFeaturesPrefix+f] = "true"
	}
	switch x := g.r.IntN(20); {
	case x == 0:
		delete(labels, reference.HostModelCPULabelPrefix+gen.model)
	case x == 1:
		labels[reference.HostModelCPULabelPrefix+gen.model] = "false"
	case x == 2:
		labels[reference.HostModelCPULabelPrefix+oneOf(g.r, g.gens).model] = "true" // maybe a second
	case x == 3:
		labels[reference.HostModelCPULabelPrefix+oneOf(g.r, migModels)] = "false"
	}
	for g.chance(0.3) {
		g.flip(labels)
	}
	if g.chance(0.05) {
		odd := oneOf(g.r, []string{
			reference.CPUFeatureLabelPrefix + oneOf(g.r, migFeatures) + "/v2",
			reference.CPUModelMigrationLabelPrefix,
			reference.HostModelCPULabelPrefix + gen.model + "/x",
			reference.SchedulableLabel + "-override",
		})
		labels[odd] = oneOf(g.r, []string{"true", "false"})
	}
	if g.chance(0.15) {
		labels[reference.SchedulableLabel] = oneOf(g.r, []string{"true", "true", "false", "False", ""})
	}
	if g.nonString && g.chance(0.05) {
		labels[reference.CPUFeatureLabelPrefix+oneOf(g.r, migFeatures)] = oneOf[any](g.r, []any{true, false, int64(1)})
	}
	obj := map[string]any{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata":   map[string]any{"name": name, "labels": labels},
	}
	switch x := g.r.IntN(20); {
	case x < 2:
		obj["spec"] = map[string]any{"unschedulable": true}
	case x < 4:
		obj["spec"] = map[string]any{"unschedulable": false, "podCIDR": "10.0.0.0/24"}
	case x < 5:
		obj["spec"] = map[string]any{"unschedulable": "true"} // not the boolean: schedulable
	}
	return &unstructured.Unstructured{Object: obj}
}

// flip changes one CPU label of labels: removes it, sets it "false", or adds one.
func (g *migGen) flip(labels map[string]any) {
	prefixes := []string{
		reference.CPUFeatureLabelPrefix, reference.CPUFeatureLabelPrefix,
		reference.CPUModelMigrationLabelPrefix, reference.HostModelRequiredFeaturesPrefix,
	}
	prefix := oneOf(g.r, prefixes)
	var name string
	if prefix == reference.CPUModelMigrationLabelPrefix {
		name = oneOf(g.r, g.gens).model
	} else {
		name = oneOf(g.r, migFeatures)
	}
	switch key := prefix + name; {
	case labels[key] == "true" && g.chance(0.5):
		delete(labels, key)
	case labels[key] == "true":
		labels[key] = "false"
	default:
		labels[key] = "true"
	}
}

func (g *migGen) flipCPULabel(n *unstructured.Unstructured) *unstructured.Unstructured {
	m := n.DeepCopy()
	if migLabels(m) == nil {
		_ = unstructured.SetNestedField(m.Object, map[string]any{}, "metadata", "labels")
	}
	g.flip(migLabels(m))
	return m
}

func (g *migGen) changeOtherLabels(n *unstructured.Unstructured) *unstructured.Unstructured {
	m := n.DeepCopy()
	labels := migLabels(m)
	if labels == nil {
		labels = map[string]any{}
		_ = unstructured.SetNestedField(m.Object, labels, "metadata", "labels")
	}
	labels["topology.kubernetes.io/zone"] = oneOf(g.r, []string{"a", "b", "c", "d"})
	labels["example.com/maintenance-"+fmt.Sprint(g.r.IntN(3))] = "true"
	return m
}
