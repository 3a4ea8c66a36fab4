package engine_test

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virt-rules/virt-rules/engine"
	virtrego "github.com/virt-rules/virt-rules/rego"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The MigrationPolicy benchmarks pair the engine (`rego`) with the plain Go linear scan of
// test/reference (`go`) on the same inputs, so `make bench` can print their ratio.
// Both sides get what a controller holds between decisions: the engine a prepared
// *MigrationPolicies with its index built, the reference the converted policies.

var benchPolicyCounts = []int{10, 100, 1_000, 10_000}

const (
	// benchVMIs is the number of distinct VMIs each benchmark cycles through.
	benchVMIs = 512
	// benchChecked VMIs are decided by both sides before timing, which must agree.
	benchChecked = 32
)

// benchFamily generates n policies and the VMIs to decide.
type benchFamily struct {
	name string
	// maxMatches bounds the policies any VMI matches (0: no bound).
	maxMatches int
	generate   func(r *rand.Rand, n int) ([]*unstructured.Unstructured, []engine.MigrationPolicySubject)
}

var benchFamilies = []benchFamily{
	{name: "random", generate: randomPolicies},
	{name: "sparse", maxMatches: 10, generate: sparsePolicies},
}

func BenchmarkMigrationPolicy(b *testing.B) {
	ctx := context.Background()
	eng, settings := benchEngine(b)
	for _, family := range benchFamilies {
		b.Run(family.name, func(b *testing.B) {
			for _, n := range benchPolicyCounts {
				b.Run(strconv.Itoa(n), func(b *testing.B) {
					c := prepareBenchCase(b, eng, settings, family, n)
					b.Run("rego", func(b *testing.B) {
						b.ReportAllocs()
						for i := 0; b.Loop(); i++ {
							if _, err := c.set.Decide(ctx, c.subjects[i%len(c.subjects)]); err != nil {
								b.Fatal(err)
							}
						}
						b.ReportMetric(c.matchesPerVMI, "matches/vmi")
					})
					b.Run("go", func(b *testing.B) {
						b.ReportAllocs()
						for i := 0; b.Loop(); i++ {
							reference.Decide(c.policies, c.vmis[i%len(c.vmis)], settings, c.cluster)
						}
						b.ReportMetric(c.matchesPerVMI, "matches/vmi")
					})
				})
			}
		})
	}
}

// benchCase is one family at one size, prepared for both sides.
type benchCase struct {
	set      *engine.MigrationPolicies // index built
	subjects []engine.MigrationPolicySubject

	policies []reference.Policy
	vmis     []reference.VMI
	cluster  kubevirtv1.VMIMConfigurationOptions

	matchesPerVMI float64
}

// prepareBenchCase generates n policies of family and their VMIs, builds the engine's index,
// and checks the family's bound on matches and that both sides agree on the first VMIs.
func prepareBenchCase(b *testing.B, eng *engine.Engine, settings reference.Settings, family benchFamily, n int) benchCase {
	b.Helper()
	ctx := context.Background()
	kubevirt := benchKubeVirt()
	policies, subjects := family.generate(rand.New(rand.NewPCG(uint64(n), 1)), n)
	set, err := eng.MigrationPolicies(policies, kubevirt)
	if err != nil {
		b.Fatal(err)
	}
	if malformed, err := set.Malformed(ctx); err != nil || len(malformed) > 0 {
		b.Fatalf("index: %v, malformed %v", err, malformed)
	}
	c := benchCase{set: set, subjects: subjects, vmis: make([]reference.VMI, len(subjects))}
	c.policies, c.cluster = referenceInputs(b, diffInput{Policies: policies, KubeVirt: kubevirt}, settings)
	matches := 0
	for i, s := range subjects {
		c.vmis[i] = referenceVMI(s)
		matched := len(reference.Ranked(c.policies, c.vmis[i], settings.Precedence))
		if family.maxMatches > 0 && matched > family.maxMatches {
			b.Fatalf("VMI %s matches %d policies, more than the family's %d", s.Key(), matched, family.maxMatches)
		}
		matches += matched
		if i < benchChecked {
			got, err := set.Decide(ctx, s)
			if want := reference.Decide(c.policies, c.vmis[i], settings, c.cluster); err != nil || !sameDecision(got, want) {
				b.Fatalf("VMI %s: engine and reference disagree (%v); run TestMigrationPolicyDifferential", s.Key(), err)
			}
		}
	}
	c.matchesPerVMI = float64(matches) / float64(len(subjects))
	return c
}

// BenchmarkMigrationPolicyIndex measures what preparing a whole policy set afresh costs: the
// engine converting the policies, evaluating the index and partially evaluating `matching`
// with it, the reference converting the policies. Both report their CPU time (cpu-ns/op)
// beside their wall time.
func BenchmarkMigrationPolicyIndex(b *testing.B) {
	ctx := context.Background()
	eng, settings := benchEngine(b)
	kubevirt := benchKubeVirt()
	for _, n := range benchPolicyCounts {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			policies, _ := sparsePolicies(rand.New(rand.NewPCG(uint64(n), 1)), n)
			// The engine reuses the work of the set it prepared last for the policies that
			// are the same (BenchmarkMigrationPolicyChange): alternating with a set of other
			// names makes every iteration a full rebuild. The alternation goes on from one
			// -count run to the next, which share the engine.
			sets := [][]*unstructured.Unstructured{policies, renamed(policies, "other-")}
			prepared := 0
			b.Run("rego", func(b *testing.B) {
				b.ReportAllocs()
				defer reportCPU(b)()
				for b.Loop() {
					prepared++
					set, err := eng.MigrationPolicies(sets[prepared%2], kubevirt)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := set.Malformed(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("go", func(b *testing.B) {
				b.ReportAllocs()
				defer reportCPU(b)()
				for b.Loop() {
					referenceInputs(b, diffInput{Policies: policies, KubeVirt: kubevirt}, settings)
				}
			})
		})
	}
}

// BenchmarkMigrationPolicyChange measures one policy's change to a prepared set, as a
// controller sees it: the engine prepares the changed set from the last one's work
// (migrationpolicyreuse.go); the reference converts the changed policy and puts it in place
// of the old one in its converted set. Each iteration changes the same policy back and forth
// between two specs, so every one is a real change. The policies carry a UID and a
// resourceVersion, as an informer's do, and each change a new resourceVersion.
func BenchmarkMigrationPolicyChange(b *testing.B) {
	ctx := context.Background()
	eng, settings := benchEngine(b)
	kubevirt := benchKubeVirt()
	for _, n := range []int{50, 1_000, 10_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			policies, _ := sparsePolicies(rand.New(rand.NewPCG(uint64(n), 1)), n)
			for i, p := range policies {
				p.SetUID(types.UID(fmt.Sprintf("uid-%d", i)))
				p.SetResourceVersion("1")
			}
			at := n / 2
			variants := []*unstructured.Unstructured{
				policies[at],
				policyObject(policies[at].GetName(), map[string]any{"matchLabels": map[string]any{"app": "changed"}}, nil, map[string]any{"maxDowntimeMs": int64(300)}),
			}
			variants[1].SetUID(policies[at].GetUID())
			// version is variant v as the API server stores it after change i.
			version := func(v, i int) *unstructured.Unstructured {
				u := variants[v].DeepCopy()
				u.SetResourceVersion(strconv.Itoa(i + 2))
				return u
			}
			b.Run("rego", func(b *testing.B) {
				current := slices.Clone(policies)
				prepare := func() {
					set, err := eng.MigrationPolicies(current, kubevirt)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := set.Malformed(ctx); err != nil {
						b.Fatal(err)
					}
				}
				prepare() // the set a change starts from
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					current[at] = version((i+1)%2, i)
					prepare()
				}
			})
			b.Run("go", func(b *testing.B) {
				converted, _ := referenceInputs(b, diffInput{Policies: policies, KubeVirt: kubevirt}, settings)
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					one, err := reference.PoliciesFromUnstructured(variants[(i+1)%2:(i+1)%2+1], settings.PolicyFields)
					if err != nil {
						b.Fatal(err)
					}
					converted[at] = one[0]
				}
			})
		})
	}
}

// reportCPU starts counting the process's CPU time (user and system: every goroutine, the
// garbage collector's too) and returns what reports it per iteration as cpu-ns/op: on a
// loaded machine ns/op counts the time waiting for a core, cpu-ns/op what each side spent.
func reportCPU(b *testing.B) func() {
	start := processCPU(b)
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// renamed is policies with prefix before each name.
func renamed(policies []*unstructured.Unstructured, prefix string) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(policies))
	for i, p := range policies {
		out[i] = p.DeepCopy()
		out[i].SetName(prefix + p.GetName())
	}
	return out
}

// benchEngine serves the embedded bundle; the reference follows its settings.
func benchEngine(b *testing.B) (*engine.Engine, reference.Settings) {
	b.Helper()
	raw, err := fs.ReadFile(virtrego.Bundle(), policyDataPath)
	if err != nil {
		b.Fatal(err)
	}
	settings, err := reference.ParseSettings(raw)
	if err != nil {
		b.Fatal(err)
	}
	eng, err := engine.New(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return eng, settings
}

func benchKubeVirt() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "KubeVirt",
		"metadata":   map[string]any{"name": "kubevirt", "namespace": "kubevirt"},
		"spec": map[string]any{"configuration": map[string]any{"migrations": map[string]any{
			"bandwidthPerMigration":   "64Mi",
			"completionTimeoutPerGiB": int64(800),
			"allowPostCopy":           true,
		}}},
	}}
}

// benchOverrides is a policy's configuration: a few fields, as policies usually set.
func benchOverrides(r *rand.Rand) map[string]any {
	cfg := map[string]any{"maxDowntimeMs": int64(100 + r.IntN(900))}
	if r.IntN(2) == 0 {
		cfg["allowAutoConverge"] = true
	}
	if r.IntN(4) == 0 {
		cfg["allowWorkloadDisruption"] = false
	}
	return cfg
}

// randomPolicies draws every policy's requirements from shared pools (8 VMI label keys and 4
// namespace label keys, 4 values each), so the number of policies a VMI matches grows with n.
func randomPolicies(r *rand.Rand, n int) ([]*unstructured.Unstructured, []engine.MigrationPolicySubject) {
	key := func(prefix string, i int) string { return fmt.Sprintf("%s%d.example.com/label", prefix, i) }
	value := func() string { return "value-" + strconv.Itoa(r.IntN(4)) }
	requirements := func(prefix string, keys, fewest, most int) map[string]any {
		reqs := map[string]any{}
		for range fewest + r.IntN(most-fewest+1) {
			if r.IntN(10) == 0 {
				reqs[key(prefix, r.IntN(keys))] = ""
			} else {
				reqs[key(prefix, r.IntN(keys))] = value()
			}
		}
		return reqs
	}
	policies := make([]*unstructured.Unstructured, n)
	for i := range policies {
		policies[i] = policyObject(fmt.Sprintf("policy-%05d", i),
			requirements("vmi", 8, 1, 3), requirements("ns", 4, 0, 2), benchOverrides(r))
	}
	subjects := make([]engine.MigrationPolicySubject, benchVMIs)
	for i := range subjects {
		s := engine.MigrationPolicySubject{
			Namespace: "ns-" + strconv.Itoa(r.IntN(20)), Name: "vmi-" + strconv.Itoa(i),
			Labels: map[string]string{}, NamespaceLabels: map[string]string{},
		}
		for k := range 8 {
			if r.IntN(10) < 7 {
				s.Labels[key("vmi", k)] = value()
			}
		}
		for k := range 4 {
			if r.IntN(10) < 7 {
				s.NamespaceLabels[key("ns", k)] = value()
			}
		}
		subjects[i] = s
	}
	return policies, subjects
}

// sparsePolicies is a realistic set: four broad policies (every VMI, any tier, production
// namespaces, Windows VMIs), then pairs of policies per application (VMI label app) or per
// tenant (namespace label tenant), the second of each pair narrowed by one shared label (tier
// or env). A VMI matches at most 4 + 2 + 2 policies, however many there are.
func sparsePolicies(r *rand.Rand, n int) ([]*unstructured.Unstructured, []engine.MigrationPolicySubject) {
	broad := []struct{ vmi, ns map[string]any }{
		{map[string]any{}, map[string]any{}},
		{map[string]any{"tier": ""}, map[string]any{}},
		{map[string]any{}, map[string]any{"env": "prod"}},
		{map[string]any{"os": "windows"}, map[string]any{}},
	}
	tiers, envs := []string{"web", "db", "cache"}, []string{"prod", "dev"}
	policies := make([]*unstructured.Unstructured, 0, n)
	for i := range n {
		vmi, ns := map[string]any{}, map[string]any{}
		switch group := (i - len(broad)) / 2; {
		case i < len(broad):
			vmi, ns = broad[i].vmi, broad[i].ns
		case group%2 == 0:
			vmi["app"] = "app-" + strconv.Itoa(group)
			if i%2 == 1 {
				vmi["tier"] = oneOf(r, tiers)
			}
		default:
			ns["tenant"] = "tenant-" + strconv.Itoa(group)
			if i%2 == 1 {
				ns["env"] = oneOf(r, envs)
			}
		}
		policies = append(policies, policyObject(fmt.Sprintf("policy-%05d", i),
			map[string]any{"matchLabels": vmi}, map[string]any{"matchLabels": ns}, benchOverrides(r)))
	}
	groups := max(1, (n-len(broad))/2)
	subjects := make([]engine.MigrationPolicySubject, benchVMIs)
	for i := range subjects {
		tenant := "tenant-" + strconv.Itoa(r.IntN(groups))
		subjects[i] = engine.MigrationPolicySubject{
			Namespace: tenant, Name: "vmi-" + strconv.Itoa(i),
			Labels: map[string]string{
				"app":  "app-" + strconv.Itoa(r.IntN(groups)),
				"tier": oneOf(r, tiers),
				"os":   oneOf(r, []string{"linux", "windows"}),
			},
			NamespaceLabels: map[string]string{"tenant": tenant, "env": oneOf(r, envs)},
		}
	}
	return policies, subjects
}
