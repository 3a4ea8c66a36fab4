package reference

import (
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

func labels(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// The example of design 000: its policies, listed by precedence, high to low.
func seedExample() (VMI, []Policy) {
	vmi := VMI{
		Namespace:       "hpc",
		Labels:          labels("size", "small", "os", "fedora", "gpu", "nvidia"),
		NamespaceLabels: labels("priority", "high", "bandwidth", "medium", "hpc-workload", "true"),
	}
	policies := []Policy{
		NewPolicy("p1", labels("size", "small", "gpu", "nvidia"), labels("priority", "high", "bandwidth", "medium"), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("p2", labels("size", "small", "gpu", "nvidia"), labels("priority", "high", "hpc-workload", "true"), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("p3", labels("size", "small", "gpu", "nvidia"), labels("priority", "high"), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("p4", labels("size", "small"), labels("priority", "high", "hpc-workload", "true"), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("p5", labels("gpu", "nvidia"), labels("priority", "high"), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("p6", labels("gpu", "nvidia"), labels(), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("p7", labels("gpu", "intel"), labels("priority", "high"), kubevirtv1.VMIMConfigurationOptions{}),
	}
	return vmi, policies
}

func names(ps []*Policy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func TestRankedSeedExample(t *testing.T) {
	vmi, policies := seedExample()
	// Shuffle-independent: rank them in reverse order of listing.
	slices.Reverse(policies)
	want := []string{"p1", "p2", "p3", "p4", "p5", "p6"} // p7 wants gpu=intel: no match
	if got := names(Ranked(policies, vmi, ModeDefault)); !slices.Equal(got, want) {
		t.Errorf("default precedence: got %v, want %v", got, want)
	}
	// KubeVirt ignores label keys: p3 (2 VMI labels) outranks p4 (1); p1 and p2 tie to the name.
	if got := names(Ranked(policies, vmi, ModeKubeVirt)); !slices.Equal(got, want) {
		t.Errorf("kubevirt precedence: got %v, want %v", got, want)
	}
	settings := Settings{Precedence: ModeDefault}
	if d := Decide(policies, vmi, settings, kubevirtv1.VMIMConfigurationOptions{}); d.Policy != "p1" || d.MatchingLabels != 4 {
		t.Errorf("Decide: got %s with %d labels, want p1 with 4", d.Policy, d.MatchingLabels)
	}
}

func TestPrecedenceModesDiffer(t *testing.T) {
	vmi := VMI{Namespace: "ns", Labels: labels("b", "1", "z", "1"), NamespaceLabels: labels("a", "1")}
	policies := []Policy{
		NewPolicy("vmi-heavy", labels("b", "1", "z", "1"), nil, kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("keys-first", labels("z", "1"), labels("a", "1"), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("also-keys-first", labels("z", ""), labels("a", ""), kubevirtv1.VMIMConfigurationOptions{}),
	}
	if got, want := names(Ranked(policies, vmi, ModeDefault)), []string{"also-keys-first", "keys-first", "vmi-heavy"}; !slices.Equal(got, want) {
		t.Errorf("default: got %v, want %v", got, want)
	}
	// KubeVirt reads "" as the empty value: also-keys-first does not match z=1, a=1.
	if got, want := names(Ranked(policies, vmi, ModeKubeVirt)), []string{"vmi-heavy", "keys-first"}; !slices.Equal(got, want) {
		t.Errorf("kubevirt: got %v, want %v", got, want)
	}
}

func TestNamespaceNameLabel(t *testing.T) {
	p := NewPolicy("by-name", nil, labels(NamespaceNameLabel, "team-a"), kubevirtv1.VMIMConfigurationOptions{})
	for _, tc := range []struct {
		vmi  VMI
		want bool
	}{
		{VMI{Namespace: "team-a"}, true},
		{VMI{Namespace: "team-a", NamespaceLabels: labels("x", "y")}, true},
		{VMI{Namespace: "team-b"}, false},
		{VMI{Namespace: "team-b", NamespaceLabels: labels(NamespaceNameLabel, "team-a")}, true},
		{VMI{Namespace: "team-a", NamespaceLabels: labels(NamespaceNameLabel, "other")}, false},
	} {
		if got := p.Matches(tc.vmi, ModeDefault); got != tc.want {
			t.Errorf("%+v: Matches = %v, want %v", tc.vmi, got, tc.want)
		}
	}
}

func TestLayerWorkloadDisruption(t *testing.T) {
	yes, no := true, false
	postCopy := func(b *bool) kubevirtv1.VMIMConfigurationOptions {
		return kubevirtv1.VMIMConfigurationOptions{AllowPostCopy: b}
	}
	disruption := func(b *bool) kubevirtv1.VMIMConfigurationOptions {
		return kubevirtv1.VMIMConfigurationOptions{AllowWorkloadDisruption: b}
	}
	both := func(pc, wd *bool) kubevirtv1.VMIMConfigurationOptions {
		return kubevirtv1.VMIMConfigurationOptions{AllowPostCopy: pc, AllowWorkloadDisruption: wd}
	}
	for _, tc := range []struct {
		name   string
		layers []kubevirtv1.VMIMConfigurationOptions
		want   bool
	}{
		{"defaults only", []kubevirtv1.VMIMConfigurationOptions{postCopy(&no), {}, {}}, false},
		{"cluster post-copy", []kubevirtv1.VMIMConfigurationOptions{postCopy(&no), postCopy(&yes), {}}, true},
		{"policy post-copy off", []kubevirtv1.VMIMConfigurationOptions{postCopy(&no), disruption(&yes), postCopy(&no)}, false},
		{"policy disruption wins over its post-copy", []kubevirtv1.VMIMConfigurationOptions{postCopy(&no), {}, both(&no, &yes)}, true},
		{"cluster disruption, policy silent", []kubevirtv1.VMIMConfigurationOptions{postCopy(&yes), disruption(&no), {}}, false},
	} {
		got := Layer(tc.layers...).AllowWorkloadDisruption
		if got == nil {
			t.Errorf("%s: allowWorkloadDisruption unset, want %v", tc.name, tc.want)
		} else if *got != tc.want {
			t.Errorf("%s: allowWorkloadDisruption = %v, want %v", tc.name, *got, tc.want)
		}
	}
}

// overlay names every field; this fails when kubevirt.io/api adds one.
func TestOverlayCoversEveryField(t *testing.T) {
	var src, dst kubevirtv1.VMIMConfigurationOptions
	v := reflect.ValueOf(&src).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Pointer {
			t.Fatalf("field %s is not a pointer; overlay cannot tell unset from zero", v.Type().Field(i).Name)
		}
		f.Set(reflect.New(f.Type().Elem()))
	}
	overlay(&dst, &src)
	d := reflect.ValueOf(dst)
	for i := range d.NumField() {
		if d.Field(i).IsNil() {
			t.Errorf("overlay does not copy %s", d.Type().Field(i).Name)
		}
	}
}

func TestPoliciesFromUnstructured(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "p"},
		"spec": map[string]any{
			"allowPostCopy":     true,
			"maxDowntimeMs":     int64(300),
			"disableTLS":        true, // not a policy field
			"allowAutoConverge": nil,
			"selectors": map[string]any{
				"virtualMachineInstanceSelector": map[string]any{"matchLabels": map[string]any{"app": "db", "os": ""}},
				"namespaceSelector":              map[string]any{"team": "a"},
			},
		},
	}}
	ps, err := PoliciesFromUnstructured([]*unstructured.Unstructured{obj}, []string{"allowPostCopy", "maxDowntimeMs", "allowAutoConverge"})
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	if !reflect.DeepEqual(p.VMI, labels("app", "db", "os", "")) || !reflect.DeepEqual(p.Namespace, labels("team", "a")) {
		t.Errorf("selectors: got %v / %v", p.VMI, p.Namespace)
	}
	if got, want := p.SortedKeys(), []string{"app", "os", "team"}; !slices.Equal(got, want) {
		t.Errorf("SortedKeys: got %v, want %v", got, want)
	}
	o := p.Overrides
	if o.AllowPostCopy == nil || !*o.AllowPostCopy || o.MaxDowntimeMs == nil || *o.MaxDowntimeMs != 300 || o.DisableTLS != nil || o.AllowAutoConverge != nil {
		t.Errorf("overrides: got %+v", o)
	}

	bad := obj.DeepCopy()
	bad.Object["spec"].(map[string]any)["selectors"] = map[string]any{
		"namespaceSelector": map[string]any{"matchExpressions": []any{}},
	}
	if _, err := PoliciesFromUnstructured([]*unstructured.Unstructured{bad}, nil); err == nil {
		t.Error("matchExpressions selector: want an error")
	}
}

// KubeVirt matches no VMI to a policy without spec.selectors; empty selectors match every VMI.
func TestNoSelectors(t *testing.T) {
	policy := func(selectors any) *unstructured.Unstructured {
		spec := map[string]any{}
		if selectors != nil {
			spec["selectors"] = selectors
		}
		return &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "p"}, "spec": spec}}
	}
	absent, null := policy(nil), policy(nil)
	null.Object["spec"].(map[string]any)["selectors"] = nil
	ps, err := PoliciesFromUnstructured([]*unstructured.Unstructured{absent, null, policy(map[string]any{})}, nil)
	if err != nil {
		t.Fatal(err)
	}
	vmi := VMI{Namespace: "ns", Labels: labels("app", "db")}
	for _, mode := range []Mode{ModeDefault, ModeKubeVirt} {
		if ps[0].Matches(vmi, mode) || ps[1].Matches(vmi, mode) {
			t.Errorf("%s: a policy without selectors matches", mode)
		}
		if !ps[2].Matches(vmi, mode) {
			t.Errorf("%s: empty selectors do not match", mode)
		}
	}
}

// "" is any value in design 000, the empty value in KubeVirt.
func TestEmptyRequiredValue(t *testing.T) {
	p := NewPolicy("p", labels("tier", ""), nil, kubevirtv1.VMIMConfigurationOptions{})
	for _, tc := range []struct {
		labels           map[string]string
		design, kubevirt bool
	}{
		{labels("tier", "front"), true, false},
		{labels("tier", ""), true, true},
		{labels("app", "db"), false, false},
	} {
		vmi := VMI{Namespace: "ns", Labels: tc.labels}
		if got := p.Matches(vmi, ModeDefault); got != tc.design {
			t.Errorf("%v, default: Matches = %v, want %v", tc.labels, got, tc.design)
		}
		if got := p.Matches(vmi, ModeKubeVirt); got != tc.kubevirt {
			t.Errorf("%v, kubevirt: Matches = %v, want %v", tc.labels, got, tc.kubevirt)
		}
	}
}

// KubeVirt reads neither selector of a VMI without labels: every policy with selectors matches
// with 0 labels and the first name wins. Design 000 reads the selectors.
func TestUnlabelledVMI(t *testing.T) {
	none := NewPolicy("a-none", nil, nil, kubevirtv1.VMIMConfigurationOptions{})
	none.NoSelectors = true
	policies := []Policy{
		NewPolicy("d-all", nil, nil, kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("c-namespace", nil, labels("team", "x"), kubevirtv1.VMIMConfigurationOptions{}),
		NewPolicy("b-gpu", labels("gpu", "nvidia"), nil, kubevirtv1.VMIMConfigurationOptions{}),
		none,
	}
	for _, vmiLabels := range []map[string]string{nil, {}} {
		vmi := VMI{Namespace: "ns", Labels: vmiLabels, NamespaceLabels: labels("team", "y")}
		if got, want := names(Ranked(policies, vmi, ModeKubeVirt)), []string{"b-gpu", "c-namespace", "d-all"}; !slices.Equal(got, want) {
			t.Errorf("labels %#v, kubevirt: got %v, want %v", vmiLabels, got, want)
		}
		d := Decide(policies, vmi, Settings{Precedence: ModeKubeVirt}, kubevirtv1.VMIMConfigurationOptions{})
		if d.Policy != "b-gpu" || d.MatchingLabels != 0 {
			t.Errorf("labels %#v, kubevirt: Decide got %s with %d labels, want b-gpu with 0", vmiLabels, d.Policy, d.MatchingLabels)
		}
		if got, want := names(Ranked(policies, vmi, ModeDefault)), []string{"d-all"}; !slices.Equal(got, want) {
			t.Errorf("labels %#v, default: got %v, want %v", vmiLabels, got, want)
		}
	}
	labelled := VMI{Namespace: "ns", Labels: labels("app", "db"), NamespaceLabels: labels("team", "x")}
	if d := Decide(policies, labelled, Settings{Precedence: ModeKubeVirt}, kubevirtv1.VMIMConfigurationOptions{}); d.Policy != "c-namespace" || d.MatchingLabels != 1 {
		t.Errorf("labelled, kubevirt: Decide got %s with %d labels, want c-namespace with 1", d.Policy, d.MatchingLabels)
	}
}

// The experimental options are overlaid field by field; overlayExperimental names every field.
func TestLayerExperimental(t *testing.T) {
	var src kubevirtv1.StallDetectorOptions
	v := reflect.ValueOf(&src).Elem()
	for i := range v.NumField() {
		v.Field(i).Set(reflect.New(v.Field(i).Type().Elem()))
	}
	zstd := kubevirtv1.MigrationCompressionZstd
	below := kubevirtv1.VMIMConfigurationOptions{ExperimentalMigrationOptions: &kubevirtv1.ExperimentalMigrationOptions{Compression: &zstd}}
	over := kubevirtv1.VMIMConfigurationOptions{ExperimentalMigrationOptions: &kubevirtv1.ExperimentalMigrationOptions{StallDetector: &src}}
	got := Layer(below, over).ExperimentalMigrationOptions
	if got == nil || got.Compression == nil || *got.Compression != zstd || got.StallDetector == nil {
		t.Fatalf("got %+v, want zstd and the stall detector", got)
	}
	d := reflect.ValueOf(*got.StallDetector)
	for i := range d.NumField() {
		if d.Field(i).IsNil() {
			t.Errorf("overlayExperimental does not copy %s", d.Type().Field(i).Name)
		}
	}
	if below.ExperimentalMigrationOptions.StallDetector != nil {
		t.Error("Layer changed a layer")
	}
}
