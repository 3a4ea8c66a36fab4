package reference

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// cpuLabels are the labels KubeVirt's node labeller puts on a node, all set to "true".
func cpuLabels(host string, models, features, required []string) map[string]string {
	m := map[string]string{}
	if host != "" {
		m[HostModelCPULabelPrefix+host] = "true"
	}
	for _, x := range models {
		m[CPUModelMigrationLabelPrefix+x] = "true"
	}
	for _, x := range features {
		m[CPUFeatureLabelPrefix+x] = "true"
	}
	for _, x := range required {
		m[HostModelRequiredFeaturesPrefix+x] = "true"
	}
	return m
}

func with(base map[string]string, kv ...string) map[string]string {
	m := maps.Clone(base)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// Three CPU generations: each newer one accepts the older models and has more features, and a
// host-model VM started on it requires its newest feature.
var (
	skylake     = cpuLabels("Skylake", []string{"Skylake"}, []string{"vmx", "pku"}, []string{"pku"})
	cascadelake = cpuLabels("Cascadelake", []string{"Skylake", "Cascadelake"}, []string{"vmx", "pku", "avx512vnni"}, []string{"pku", "avx512vnni"})
	icelake     = cpuLabels("Icelake", []string{"Skylake", "Cascadelake", "Icelake"}, []string{"vmx", "pku", "avx512vnni", "gfni"}, []string{"pku", "gfni"})
)

// threeGenerations is worked out by hand below.
func threeGenerations() []Node {
	plain := maps.Clone(icelake)
	delete(plain, HostModelCPULabelPrefix+"Icelake")
	return []Node{
		{Name: "sky-1", Labels: skylake},
		{Name: "sky-2", Labels: with(skylake, "topology.kubernetes.io/zone", "b")},
		{Name: "cascade-1", Labels: cascadelake},
		{Name: "cascade-2", Labels: with(cascadelake, SchedulableLabel, "true")},
		{Name: "ice-1", Labels: icelake},
		{Name: "ice-cordoned", Unschedulable: true, Labels: icelake},
		{Name: "ice-disabled", Labels: with(icelake, SchedulableLabel, "false")},
		{Name: "both", Labels: with(skylake, HostModelCPULabelPrefix+"Cascadelake", "true")},
		{Name: "plain", Labels: plain},
		{Name: "sky-no-pku", Labels: with(skylake, CPUFeatureLabelPrefix+"pku", "false")},
		{Name: "odd", Labels: map[string]string{
			HostModelCPULabelPrefix + "Skylake/v2":   "true",
			CPUModelMigrationLabelPrefix + "Icelake": "True",
			CPUFeatureLabelPrefix:                    "true",
			"cpu-model.node.kubevirt.io/Icelake":     "true",
		}},
	}
}

func TestMigratabilityThreeGenerations(t *testing.T) {
	// Schedulable: all but ice-cordoned and ice-disabled, 9 nodes, so 8 others each. "both"
	// (two host models), "plain" (none) and "odd" (no valid CPU label) get no level.
	//   Skylake VMs (need model Skylake, pku) reach the other sky, cascade-1, cascade-2,
	//     ice-1, both and plain; not sky-no-pku (pku "false") nor odd: 6 of 8 -> 75.
	//   sky-no-pku's VMs need the same and reach sky-1, sky-2 too: 7 of 8 -> 87.
	//   Cascadelake VMs (Cascadelake, pku, avx512vnni): the other cascade, ice-1, plain: 3 -> 37.
	//   Icelake VMs (Icelake, pku, gfni): plain only: 1 of 8 -> 12.
	want := map[string]int{"sky-1": 75, "sky-2": 75, "sky-no-pku": 87, "cascade-1": 37, "cascade-2": 37, "ice-1": 12}
	nodes := threeGenerations()
	for name, levels := range map[string]map[string]int{
		"pairwise": MigratabilityPairwise(nodes),
		"grouped":  MigratabilityGrouped(nodes),
	} {
		if !maps.Equal(levels, want) {
			t.Errorf("%s: got %v, want %v", name, levels, want)
		}
	}

	// Without the odd and the extra nodes: design 002's example, 4 others each.
	small := nodes[:5]
	want = map[string]int{"sky-1": 100, "sky-2": 100, "cascade-1": 50, "cascade-2": 50, "ice-1": 0}
	if got := MigratabilityPairwise(small); !maps.Equal(got, want) {
		t.Errorf("pairwise, 5 nodes: got %v, want %v", got, want)
	}
	if got := MigratabilityGrouped(small); !maps.Equal(got, want) {
		t.Errorf("grouped, 5 nodes: got %v, want %v", got, want)
	}
}

func TestMigratabilityEdges(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []Node
		want  map[string]int
	}{
		{"no nodes", nil, map[string]int{}},
		{"alone", []Node{{Name: "a", Labels: skylake}}, map[string]int{"a": 0}},
		{"alone among cordoned", []Node{{Name: "a", Labels: skylake}, {Name: "b", Labels: skylake, Unschedulable: true}}, map[string]int{"a": 0}},
		{"twins", []Node{{Name: "a", Labels: skylake}, {Name: "b", Labels: skylake}}, map[string]int{"a": 100, "b": 100}},
		{"incompatible with itself", []Node{
			{Name: "odd-1", Labels: cpuLabels("Skylake", []string{"Skylake"}, []string{"vmx"}, []string{"pku"})},
			{Name: "odd-2", Labels: cpuLabels("Skylake", []string{"Skylake"}, []string{"vmx"}, []string{"pku"})},
			{Name: "ice", Labels: icelake},
		}, map[string]int{"odd-1": 50, "odd-2": 50, "ice": 0}},
		{"rounded down", []Node{
			{Name: "sky", Labels: skylake}, {Name: "c1", Labels: cascadelake}, {Name: "c2", Labels: cascadelake}, {Name: "ice", Labels: icelake},
		}, map[string]int{"sky": 100, "c1": 66, "c2": 66, "ice": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MigratabilityPairwise(tc.nodes); !maps.Equal(got, tc.want) {
				t.Errorf("pairwise: got %v, want %v", got, tc.want)
			}
			if got := MigratabilityGrouped(tc.nodes); !maps.Equal(got, tc.want) {
				t.Errorf("grouped: got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSignature(t *testing.T) {
	n := Node{Name: "x", Unschedulable: true, Labels: with(icelake,
		"cpu-model.node.kubevirt.io/Icelake", "true",
		CPUFeatureLabelPrefix+"avx", "false",
		CPUFeatureLabelPrefix+"a/b", "true",
	)}
	got := SignatureOf(n)
	want := Signature{
		Schedulable: false, HostModel: "Icelake", HasHostModel: true,
		RequiredFeatures: []string{"gfni", "pku"},
		Models:           []string{"Cascadelake", "Icelake", "Skylake"},
		Features:         []string{"avx512vnni", "gfni", "pku", "vmx"},
	}
	if got.Key() != want.Key() {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if SignatureOf(Node{Labels: skylake}).Key() == SignatureOf(Node{Labels: with(skylake, SchedulableLabel, "false")}).Key() {
		t.Error("kubevirt.io/schedulable=false does not change the signature")
	}
}

func TestNodeConversions(t *testing.T) {
	typed := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: skylake},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "n", "labels": map[string]any{
			HostModelCPULabelPrefix + "Skylake":      "true",
			CPUModelMigrationLabelPrefix + "Skylake": "true",
			CPUFeatureLabelPrefix + "vmx":            "true",
			CPUFeatureLabelPrefix + "pku":            "true",
			HostModelRequiredFeaturesPrefix + "pku":  "true",
			CPUFeatureLabelPrefix + "gfni":           true, // not a string: ignored
		}},
		"spec": map[string]any{"unschedulable": true},
	}}
	a, b := NodeFromTyped(typed), NodeFromUnstructured(u)
	if a.Name != b.Name || a.Unschedulable != b.Unschedulable || !maps.Equal(a.Labels, b.Labels) {
		t.Errorf("typed %+v, unstructured %+v", a, b)
	}
	u.Object["spec"] = map[string]any{"unschedulable": "true"} // not the boolean true
	if NodeFromUnstructured(u).Unschedulable {
		t.Error(`spec.unschedulable "true" (a string) cordons the node`)
	}
}

// randomNode draws labels from small pools so that nodes often reach each other, share
// signatures, and hit every edge: "false" values, several host models, cordons.
func randomNode(r *rand.Rand, name string) Node {
	models := []string{"M0", "M1", "M2", "M3"}
	features := []string{"f0", "f1", "f2", "f3", "f4", "f5"}
	value := func() string { return []string{"true", "true", "true", "false", "yes"}[r.IntN(5)] }
	n := Node{Name: name, Unschedulable: r.IntN(8) == 0, Labels: map[string]string{}}
	for range r.IntN(3) {
		n.Labels[HostModelCPULabelPrefix+models[r.IntN(len(models))]] = value()
	}
	for _, m := range models {
		if r.IntN(2) == 0 {
			n.Labels[CPUModelMigrationLabelPrefix+m] = value()
		}
	}
	for _, f := range features {
		if r.IntN(4) != 0 {
			n.Labels[CPUFeatureLabelPrefix+f] = value()
		}
		if r.IntN(5) == 0 {
			n.Labels[HostModelRequiredFeaturesPrefix+f] = value()
		}
	}
	if r.IntN(6) == 0 {
		n.Labels[SchedulableLabel] = []string{"false", "true", "False"}[r.IntN(3)]
	}
	if r.IntN(10) == 0 {
		n.Labels[CPUFeatureLabelPrefix+features[0]+"/x"] = "true"
	}
	return n
}

// toUnstructured stores n as the API server would, plus a label whose value is not a
// string, which the readers of stored Nodes ignore.
func toUnstructured(n Node) *unstructured.Unstructured {
	labels := map[string]any{CPUFeatureLabelPrefix + "not-a-string": true}
	for k, v := range n.Labels {
		labels[k] = v
	}
	obj := map[string]any{"metadata": map[string]any{"name": n.Name, "labels": labels}}
	if n.Unschedulable {
		obj["spec"] = map[string]any{"unschedulable": true}
	}
	return &unstructured.Unstructured{Object: obj}
}

func TestMigratabilityGroupedMatchesPairwise(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	mid := 0
	for cluster := range 300 {
		nodes := make([]Node, r.IntN(25))
		for i := range nodes {
			nodes[i] = randomNode(r, fmt.Sprintf("n%d", i))
		}
		want := MigratabilityPairwise(nodes)
		if got := MigratabilityGrouped(nodes); !maps.Equal(got, want) {
			t.Fatalf("cluster %d: grouped %v, pairwise %v\nnodes: %+v", cluster, got, want, nodes)
		}
		objs := make([]*unstructured.Unstructured, len(nodes))
		for i, n := range nodes {
			objs[i] = toUnstructured(n)
		}
		if got := MigratabilityGroupedUnstructured(objs); !maps.Equal(got, want) {
			t.Fatalf("cluster %d: grouped (unstructured) %v, pairwise %v\nnodes: %+v", cluster, got, want, nodes)
		}
		for _, l := range want {
			if l > 0 && l < 100 {
				mid++
			}
		}

		// The incremental view, after every add, relabel, cordon and delete.
		v := NewMigratabilityView()
		for _, n := range nodes {
			v.Upsert(n)
		}
		for step := range 20 {
			switch i := r.IntN(max(1, len(nodes))); {
			case len(nodes) == 0 || r.IntN(3) == 0:
				n := randomNode(r, fmt.Sprintf("n%d-%d", cluster, step))
				nodes = append(nodes, n)
				v.Upsert(n)
			case r.IntN(2) == 0:
				v.Delete(nodes[i].Name)
				nodes = slices.Delete(nodes, i, i+1)
			case r.IntN(2) == 0:
				nodes[i].Unschedulable = !nodes[i].Unschedulable
				v.Upsert(nodes[i])
			default:
				nodes[i] = randomNode(r, nodes[i].Name)
				v.Upsert(nodes[i])
			}
			if got, want := v.Levels(), MigratabilityPairwise(nodes); !maps.Equal(got, want) || v.Len() != len(nodes) {
				t.Fatalf("cluster %d step %d: view %v (%d nodes), pairwise %v\nnodes: %+v", cluster, step, got, v.Len(), want, nodes)
			}
		}
	}
	if mid < 100 {
		t.Errorf("only %d levels strictly between 0 and 100; the generator needs adjusting", mid)
	}
}

// TestMigratabilityManyLabels has more CPU label keys than a machine word holds bits, in an
// order that interns a generation's labels before and after the others'.
func TestMigratabilityManyLabels(t *testing.T) {
	var features []string
	for i := range 150 {
		features = append(features, fmt.Sprintf("feature-%03d", i))
	}
	gens := []map[string]string{
		cpuLabels("G0", []string{"G0"}, features[:50], features[40:50]),
		cpuLabels("G1", []string{"G0", "G1"}, features[:100], features[90:100]),
		cpuLabels("G2", []string{"G0", "G1", "G2"}, features[:150], features[140:150]),
	}
	r := rand.New(rand.NewPCG(3, 3))
	var nodes []Node
	for i := range 60 {
		n := Node{Name: fmt.Sprintf("n%02d", i), Labels: gens[[]int{2, 0, 1}[i%3]]}
		if r.IntN(4) == 0 { // lacks one feature
			n.Labels = with(n.Labels, CPUFeatureLabelPrefix+oneFeature(r, features), "false")
		}
		nodes = append(nodes, n)
	}
	want := MigratabilityPairwise(nodes)
	if got := MigratabilityGrouped(nodes); !maps.Equal(got, want) {
		t.Errorf("grouped %v, pairwise %v", got, want)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Values(want)), func(l int) bool { return l > 0 && l < 100 }) {
		t.Errorf("no level strictly between 0 and 100: %v", want)
	}
}

func oneFeature(r *rand.Rand, features []string) string { return features[r.IntN(len(features))] }
