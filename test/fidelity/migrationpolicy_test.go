//go:build libvirt

package fidelity_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// The MigrationPolicy decision and its validation, judged by KubeVirt's own code: for
// generated clusters (seeded, the same on every run; one with policies that match every VMI,
// one without, so that some VMIs match none), kubevirt-oracle's migration-policy gives
// the policy virt-controller's matchPolicy chooses for each VMI, among the policies virt-api's
// MigrationPolicy admitter admits, and the admitter's verdict on each policy. virt-rules
// decides with the same engine method `eval` and the controller call (MigrationPolicies, then
// Decide per VMI), over the same admitted policies, and validates each policy as `eval` does
// (ValidateMigrationPolicyIn against all of them).
//
//   - precedence kubevirt: the same policy as KubeVirt for every VMI;
//   - precedence default (the shipped bundle): the same policy, or a difference of a class
//     the README documents (design 000's reading of "", of a VMI without labels, its tie
//     order), checked against the policies involved;
//   - validation: every policy KubeVirt refuses, virt-rules refuses, on KubeVirt's fields; it
//     refuses more only by documented rules.

// The generated clusters: seed, and whether some policies match every VMI (selectors: {} and
// the like).
var policyWorlds = []struct {
	seed     uint64
	catchAll bool
}{{15, true}, {16, false}}

const (
	worldPolicies = 150 // per cluster
	worldVMIs     = 1500
)

// Classes of the default precedence's differences from KubeVirt (README, "Decisions and
// their contracts").
const (
	classSame       = "same policy as KubeVirt"
	classUnlabelled = `VMI without labels: KubeVirt reads no selector, design 000 reads them`
	classWildcard   = `"" is any value in design 000, the empty value in KubeVirt`
	classTieOrder   = "design 000's tie order: sorted label keys before VMI labels"
)

// Classes of the policies virt-rules refuses and KubeVirt v1.8 admits.
const (
	classDuplicate   = "same selectors as another policy (design 000)"
	classV19         = "KubeVirt v1.9's ranges (maxDowntimeMs, experimental; v1.8 stores neither)"
	classLabelSyntax = "label syntax (Kubernetes' rules; KubeVirt checks none)"
)

// genPolicy is a generated MigrationPolicy and its selectors as maps (nil: absent).
type genPolicy struct {
	name          string
	noSelectors   bool
	vmi, ns       map[string]string
	obj           *unstructured.Unstructured
	refusedByKV   bool
	kubevirtCause []string
}

type genVMI struct {
	namespace, name string
	labels          map[string]string // nil: no labels
	obj             *unstructured.Unstructured
}

// policyWorld is one generated cluster.
type policyWorld struct {
	seed       uint64
	policies   []*genPolicy
	vmis       []*genVMI
	namespaces map[string]map[string]string // the Namespaces given, by name; others are not
	objects    []*unstructured.Unstructured // every object, in the order given to both
}

var (
	worldVMIKeys       = []string{"app", "tier", "os", "gpu", "size"}
	worldNamespaceKeys = []string{"team", "priority", "env", "kubernetes.io/metadata.name"}
	worldValues        = []string{"a", "b", "c", ""}
	worldNamespaces    = []string{"ns-0", "ns-1", "ns-2", "ns-3", "ns-4", "ns-5", "ns-6", "ns-7", "ns-8", "ns-9", "ns-10", "ns-11"}
	worldNameStems     = []string{"alpha", "beta", "gamma", "delta", "omega"}
)

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

// labelMap draws up to most labels of keys.
func labelMap(r *rand.Rand, keys []string, most int) map[string]string {
	m := map[string]string{}
	for range r.IntN(most + 1) {
		key := pick(r, keys)
		if key == "kubernetes.io/metadata.name" {
			m[key] = pick(r, worldNamespaces)
		} else {
			m[key] = pick(r, worldValues)
		}
	}
	return m
}

func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func newPolicyWorld(seed uint64, catchAll bool) *policyWorld {
	r := rand.New(rand.NewPCG(seed, seed))
	w := &policyWorld{seed: seed, namespaces: map[string]map[string]string{}}
	// Namespaces 0-8 are given, 9-11 are not (their VMIs are in namespaces with only the name
	// label); 0 and 1 have no labels of their own; some state the name label, as the API
	// server stores it.
	for i, name := range worldNamespaces[:9] {
		labels := map[string]string{}
		if i >= 2 {
			labels = labelMap(r, worldNamespaceKeys[:3], 3)
			if r.IntN(3) == 0 {
				labels["kubernetes.io/metadata.name"] = name
			}
		}
		w.namespaces[name] = labels
		meta := map[string]any{"name": name}
		if len(labels) > 0 {
			meta["labels"] = anyMap(labels)
		}
		w.objects = append(w.objects, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": meta}})
	}
	names := map[string]bool{}
	for len(w.policies) < worldPolicies {
		name := fmt.Sprintf("%s-%02d", pick(r, worldNameStems), r.IntN(100))
		if names[name] {
			continue
		}
		names[name] = true
		p := w.policy(r, name, catchAll)
		w.policies = append(w.policies, p)
		w.objects = append(w.objects, p.obj)
	}
	for i := range worldVMIs {
		v := &genVMI{namespace: pick(r, worldNamespaces), name: fmt.Sprintf("vmi-%04d", i)}
		meta := map[string]any{"name": v.name, "namespace": v.namespace}
		switch n := r.IntN(10); {
		case n == 0: // no labels
		case n == 1: // labels: {}, the same once stored
			meta["labels"] = map[string]any{}
		default:
			v.labels = labelMap(r, worldVMIKeys, 4)
			if len(v.labels) == 0 || r.IntN(8) == 0 {
				v.labels["kubevirt.io/nodeName"] = "node-1" // as virt-handler labels a running VMI
			}
			meta["labels"] = anyMap(v.labels)
		}
		v.obj = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
			"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}},
		}}
		w.vmis = append(w.vmis, v)
		w.objects = append(w.objects, v.obj)
	}
	return w
}

// policy draws one MigrationPolicy: selectors in every shape KubeVirt stores (absent, {},
// empty maps, one or both, "" values, the namespace name label), and now and then a value
// KubeVirt v1.8 or v1.9 or virt-rules refuses. Without catchAll, every policy with selectors
// requires a label.
func (w *policyWorld) policy(r *rand.Rand, name string, catchAll bool) *genPolicy {
	p := &genPolicy{name: name}
	spec := map[string]any{}
	switch n := r.IntN(100); {
	case n < 4:
		p.noSelectors = true
		if n < 2 {
			spec["selectors"] = nil
		}
	case n < 8 && catchAll:
		spec["selectors"] = map[string]any{}
	default:
		selectors := map[string]any{}
		if r.IntN(10) < 8 {
			p.vmi = labelMap(r, worldVMIKeys, 3)
			selectors["virtualMachineInstanceSelector"] = anyMap(p.vmi)
		}
		if r.IntN(10) < 6 {
			p.ns = labelMap(r, worldNamespaceKeys, 2)
			selectors["namespaceSelector"] = anyMap(p.ns)
		}
		if r.IntN(30) == 0 {
			if p.vmi == nil {
				p.vmi = map[string]string{}
				selectors["virtualMachineInstanceSelector"] = map[string]any{}
			}
			p.vmi["not a label key!"] = "a"
			selectors["virtualMachineInstanceSelector"].(map[string]any)["not a label key!"] = "a"
		}
		if !catchAll && len(p.vmi)+len(p.ns) == 0 {
			p.vmi = map[string]string{pick(r, worldVMIKeys): pick(r, worldValues)}
			selectors["virtualMachineInstanceSelector"] = anyMap(p.vmi)
		}
		spec["selectors"] = selectors
	}
	if r.IntN(4) == 0 {
		spec["allowPostCopy"] = r.IntN(2) == 0
	}
	if r.IntN(6) == 0 {
		spec["bandwidthPerMigration"] = pick(r, []any{"64Mi", "1Gi", "-1Mi", "-0.5", "-0", int64(1 << 20), int64(-1), "0"})
	}
	if r.IntN(6) == 0 {
		spec["completionTimeoutPerGiB"] = pick(r, []int64{0, 150, -1, -300})
	}
	if r.IntN(20) == 0 {
		spec["maxDowntimeMs"] = pick(r, []int64{300, 0, 2000001})
	}
	if r.IntN(20) == 0 {
		spec["experimental"] = pick(r, []any{
			map[string]any{"stallDetector": map[string]any{"stallMargin": int64(5)}},
			map[string]any{"stallDetector": map[string]any{"ewmaAlpha": "2"}},
			map[string]any{"compression": "lz4"},
		})
	}
	p.obj = &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
	return p
}

// policyOracleLine is one line of kubevirt-oracle migration-policy.
type policyOracleLine struct {
	Source    string  `json:"source"`
	Kind      string  `json:"kind"`
	Namespace string  `json:"namespace"`
	Name      string  `json:"name"`
	Skipped   bool    `json:"skipped"`
	Allowed   *bool   `json:"allowed"`
	Message   string  `json:"message"`
	Policy    *string `json:"policy"`
	Causes    []struct {
		Field string `json:"field"`
	} `json:"causes"`
	Notes []string `json:"notes"`
	Error string   `json:"error"`
}

// precedenceEngine is an engine on a copy of the shipped bundle with settings.precedence set,
// as an admin sets it (bundle data only); the copy leaves out the bundle's Rego tests, which
// are written for the shipped settings.
func precedenceEngine(precedence string) *engine.Engine {
	GinkgoHelper()
	dir := clustersuite.ShippedBundleDir()
	data := filepath.Join(dir, "virtrules", "migration", "policy", "data.json")
	raw, err := os.ReadFile(data)
	Expect(err).NotTo(HaveOccurred())
	var doc map[string]any
	Expect(json.Unmarshal(raw, &doc)).To(Succeed())
	doc["settings"].(map[string]any)["precedence"] = precedence
	raw, err = json.Marshal(doc)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(data, raw, 0o644)).To(Succeed())
	eng, err := engine.New(ctx, engine.WithBundlePath(dir))
	Expect(err).NotTo(HaveOccurred())
	return eng
}

// decideAll decides every VMI of w over policies, as `eval` does: the VMI's labels as given,
// its Namespace's labels when the Namespace is given (else none: the engine derives the name
// label).
func decideAll(eng *engine.Engine, w *policyWorld, policies []*unstructured.Unstructured) map[string]string {
	GinkgoHelper()
	set, err := eng.MigrationPolicies(policies, nil)
	Expect(err).NotTo(HaveOccurred())
	out := make(map[string]string, len(w.vmis))
	for _, v := range w.vmis {
		subject := engine.MigrationPolicySubject{Namespace: v.namespace, Name: v.name, Labels: v.obj.GetLabels()}
		if labels, ok := w.namespaces[v.namespace]; ok {
			subject.NamespaceLabels = labels
		}
		d, err := set.Decide(ctx, subject)
		Expect(err).NotTo(HaveOccurred(), "VMI %s", subject.Key())
		out[subject.Key()] = d.Policy
	}
	return out
}

// label is the value of key on v (scope vmi) or its Namespace, as a cluster has them.
func (w *policyWorld) label(v *genVMI, namespaceScope bool, key string) (string, bool) {
	if !namespaceScope {
		value, ok := v.labels[key]
		return value, ok
	}
	if key == "kubernetes.io/metadata.name" {
		return v.namespace, true
	}
	value, ok := w.namespaces[v.namespace][key]
	return value, ok
}

// exactMatch tells whether v carries every label p requires with the very value: KubeVirt's
// reading for a VMI with labels.
func (w *policyWorld) exactMatch(p *genPolicy, v *genVMI) bool { return w.matches(p, v, false) }

// designMatch tells whether v carries every label p requires, a required "" meaning any value:
// design 000's reading.
func (w *policyWorld) designMatch(p *genPolicy, v *genVMI) bool { return w.matches(p, v, true) }

func (w *policyWorld) matches(p *genPolicy, v *genVMI, anyValue bool) bool {
	if p.noSelectors {
		return false
	}
	for scope, reqs := range map[bool]map[string]string{false: p.vmi, true: p.ns} {
		for key, want := range reqs {
			if got, ok := w.label(v, scope, key); !ok || (got != want && !(anyValue && want == "")) {
				return false
			}
		}
	}
	return true
}

func (p *genPolicy) size() int { return len(p.vmi) + len(p.ns) }

func (p *genPolicy) sortedKeys() []string {
	keys := slices.AppendSeq(slices.Collect(maps.Keys(p.vmi)), maps.Keys(p.ns))
	slices.Sort(keys)
	return keys
}

// differenceClass says which documented choice explains that the default precedence chose
// policy mine where KubeVirt chose theirs ("" for none) for v, or "" when none does.
func (w *policyWorld) differenceClass(v *genVMI, mine, theirs *genPolicy) string {
	switch {
	case mine != nil && !w.designMatch(mine, v):
		return "" // the default precedence chose a policy design 000 does not match
	case v.labels == nil:
		return classUnlabelled
	case mine == nil:
		return "" // design 000 matches every policy KubeVirt matches a labelled VMI to
	case !w.exactMatch(mine, v):
		return classWildcard // mine matched only by reading a required "" as any value
	case theirs != nil && w.exactMatch(theirs, v) && mine.size() == theirs.size() &&
		slices.Compare(mine.sortedKeys(), theirs.sortedKeys()) < 0:
		return classTieOrder
	}
	return ""
}

// refusalClass says which documented rule of virt-rules a violation of a policy KubeVirt
// admits is, or "" when none.
func refusalClass(v engine.Violation) string {
	switch {
	case v.Field == "spec.selectors" && strings.Contains(v.Message, "same selectors as"):
		return classDuplicate
	case v.Field == "spec.maxDowntimeMs" || strings.HasPrefix(v.Field, "spec.experimental"):
		return classV19
	case strings.HasPrefix(v.Field, "spec.selectors.") && strings.Contains(v.Message, "label key"):
		return classLabelSyntax
	}
	return ""
}

// nameOf is a policy name for messages; "" for none.
func nameOf(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func sortedCounts(counts map[string]int) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(&b, "%6d  %s\n", counts[k], k)
	}
	return b.String()
}

// judgedWorld is a generated cluster and KubeVirt's answers for it.
type judgedWorld struct {
	*policyWorld
	byName   map[string]*genPolicy
	admitted []*unstructured.Unstructured // the policies KubeVirt's admitter admits, as stored
	kubevirt map[string]*string           // VMI key -> KubeVirt's policy, nil for none
}

// judge asks kubevirt-oracle migration-policy about every object of w.
func judge(w *policyWorld) *judgedWorld {
	GinkgoHelper()
	objs := make([][]byte, len(w.objects))
	for i, o := range w.objects {
		raw, err := o.MarshalJSON()
		Expect(err).NotTo(HaveOccurred())
		objs[i] = raw
	}
	j := &judgedWorld{policyWorld: w, byName: map[string]*genPolicy{}, kubevirt: map[string]*string{}}
	for _, p := range w.policies {
		j.byName[p.name] = p
	}
	for i, line := range oracleLines[policyOracleLine]("migration-policy", objs) {
		Expect(line.Error).To(BeEmpty(), "kubevirt-oracle has no answer for %s", line.Source)
		switch line.Kind {
		case "MigrationPolicy":
			p := j.byName[line.Name]
			Expect(p).NotTo(BeNil(), line.Source)
			Expect(line.Allowed).NotTo(BeNil(), line.Source)
			if *line.Allowed {
				j.admitted = append(j.admitted, w.objects[i])
				continue
			}
			p.refusedByKV = true
			for _, c := range line.Causes {
				p.kubevirtCause = append(p.kubevirtCause, c.Field)
			}
		case "VirtualMachineInstance":
			j.kubevirt[line.Namespace+"/"+line.Name] = line.Policy
		}
	}
	Expect(j.kubevirt).To(HaveLen(len(w.vmis)))
	return j
}

var _ = Describe("MigrationPolicy decisions and admission, judged by KubeVirt's own matchPolicy and admitter", Ordered, func() {
	var (
		worlds  []*judgedWorld
		engines map[string]*engine.Engine // by precedence
	)

	BeforeAll(func() {
		for _, spec := range policyWorlds {
			w := newPolicyWorld(spec.seed, spec.catchAll)
			By(fmt.Sprintf("asking kubevirt-oracle migration-policy about %d policies and %d VMIs (seed %d)", len(w.policies), len(w.vmis), w.seed))
			j := judge(w)
			worlds = append(worlds, j)
			AddReportEntry("MigrationPolicy cluster", fmt.Sprintf("seed %d: %d policies (%d admitted by KubeVirt's admitter), %d VMIs, %d of %d namespaces given, policies matching every VMI: %v",
				w.seed, len(w.policies), len(j.admitted), len(w.vmis), len(w.namespaces), len(worldNamespaces), spec.catchAll))
		}
		engines = map[string]*engine.Engine{"default": precedenceEngine("default"), "kubevirt": precedenceEngine("kubevirt")}
	})

	It("names KubeVirt's policy for every VMI under precedence: kubevirt", func() {
		var mismatches []string
		vmis, matched, unlabelled := 0, 0, 0
		for _, w := range worlds {
			got := decideAll(engines["kubevirt"], w.policyWorld, w.admitted)
			for _, v := range w.vmis {
				key := v.namespace + "/" + v.name
				want := nameOf(w.kubevirt[key])
				vmis++
				if want != "" {
					matched++
				}
				if v.labels == nil {
					unlabelled++
				}
				if got[key] != want {
					mismatches = append(mismatches, fmt.Sprintf("seed %d, %s (labels %v): virt-rules %q, KubeVirt %q", w.seed, key, v.labels, got[key], want))
				}
			}
		}
		AddReportEntry("precedence kubevirt", fmt.Sprintf("%d VMIs (%d without labels; %d matching a policy in KubeVirt, %d none): %d the same policy as KubeVirt's matchPolicy, %d different",
			vmis, unlabelled, matched, vmis-matched, vmis-len(mismatches), len(mismatches)))
		Expect(mismatches).To(BeEmpty())
		// The clusters exercise what they are meant to.
		Expect(unlabelled).To(BeNumerically(">", vmis/20))
		Expect(matched).To(BeNumerically(">", vmis/2))
		Expect(vmis - matched).To(BeNumerically(">", vmis/50))
	})

	It("differs from KubeVirt under the default precedence only by documented choices", func() {
		counts := map[string]int{}
		var unexplained []string
		for _, w := range worlds {
			got := decideAll(engines["default"], w.policyWorld, w.admitted)
			for _, v := range w.vmis {
				key := v.namespace + "/" + v.name
				theirs := nameOf(w.kubevirt[key])
				if got[key] == theirs {
					counts[classSame]++
					continue
				}
				class := w.differenceClass(v, w.byName[got[key]], w.byName[theirs])
				if class == "" {
					unexplained = append(unexplained, fmt.Sprintf("seed %d, %s (labels %v, namespace %v): virt-rules %q, KubeVirt %q", w.seed, key, v.labels, w.namespaces[v.namespace], got[key], theirs))
					continue
				}
				counts[class]++
			}
		}
		AddReportEntry("precedence default, VMIs per class", sortedCounts(counts))
		Expect(unexplained).To(BeEmpty())
		for _, class := range []string{classSame, classUnlabelled, classWildcard, classTieOrder} {
			Expect(counts).To(HaveKey(class), "no VMI of class %q", class)
		}
	})

	It("refuses every policy KubeVirt's admitter refuses, and more only by documented rules", func() {
		for _, precedence := range []string{"default", "kubevirt"} {
			eng := engines[precedence]
			counts := map[string]int{}
			var wrong []string
			for _, w := range worlds {
				all := make([]*unstructured.Unstructured, len(w.policies))
				for i, p := range w.policies {
					all[i] = p.obj
				}
				existing := eng.ExistingMigrationPolicies(all)
				for _, p := range w.policies {
					violations, err := eng.ValidateMigrationPolicyIn(ctx, p.obj, existing)
					Expect(err).NotTo(HaveOccurred())
					for _, msg := range compareAdmission(p, violations, counts) {
						wrong = append(wrong, fmt.Sprintf("seed %d, %s", w.seed, msg))
					}
				}
			}
			AddReportEntry("validation, precedence "+precedence+", policies per class", sortedCounts(counts))
			Expect(wrong).To(BeEmpty(), "precedence %s", precedence)
			Expect(counts["refused by both"]).To(BeNumerically(">", 0))
			if precedence == "default" {
				Expect(counts).To(HaveKey(refusedOnly + classDuplicate))
			} else {
				Expect(counts).NotTo(HaveKey(refusedOnly + classDuplicate))
			}
			Expect(counts).To(HaveKey(refusedOnly + classV19))
			Expect(counts).To(HaveKey(refusedOnly + classLabelSyntax))
		}
	})
})

const refusedOnly = "refused by virt-rules only: "

// compareAdmission counts p in its class by KubeVirt's verdict and virt-rules' violations, and
// returns what no documented rule explains.
func compareAdmission(p *genPolicy, violations []engine.Violation, counts map[string]int) []string {
	fields := map[string]bool{}
	for _, v := range violations {
		fields[v.Field] = true
	}
	var wrong []string
	switch {
	case p.refusedByKV && len(violations) == 0:
		wrong = append(wrong, fmt.Sprintf("%s: KubeVirt refuses it (%v), virt-rules admits it", p.name, p.kubevirtCause))
	case p.refusedByKV:
		counts["refused by both"]++
		for _, f := range p.kubevirtCause {
			if !fields[f] {
				wrong = append(wrong, fmt.Sprintf("%s: KubeVirt refuses %s, virt-rules does not (%v)", p.name, f, violations))
			}
		}
	case len(violations) == 0:
		counts["admitted by both"]++
	default:
		classes := map[string]bool{}
		for _, v := range violations {
			class := refusalClass(v)
			if class == "" {
				wrong = append(wrong, fmt.Sprintf("%s: virt-rules refuses %s (%s), KubeVirt admits it, and no documented rule says so", p.name, v.Field, v.Message))
			}
			classes[class] = true
		}
		for class := range classes {
			counts[refusedOnly+class]++
		}
	}
	return wrong
}
