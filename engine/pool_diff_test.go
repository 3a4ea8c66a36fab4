package engine_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/reference"
)

// The pool differential test plans thousands of generated pools with the engine and with the
// plain Go reference (test/reference/pool.go, written from issue 5's rules) and wants the
// same plan: names and order of creates, deletes (and whether state is kept) and updates, the
// restarts, re-provisionings, autohealing records, requeue time, status counts, and the
// volume names of every created VM.

var (
	poolSeed  = flag.Uint64("pool.seed", 30030001, "seed of the pool differential test")
	poolCases = flag.Int("pool.cases", 1500, "generated cases of the pool differential test")
)

// poolCase is one plan's input as plain JSON values.
type poolCase struct {
	Pool    map[string]any   `json:"pool"`
	VMs     []map[string]any `json:"vms"`
	VMIs    []map[string]any `json:"vmis"`
	Volumes []map[string]any `json:"volumes"`
	Now     time.Time        `json:"now"`
	Burst   int              `json:"burstLimit"`
}

func (c poolCase) input() engine.PoolInput {
	list := func(objs []map[string]any) []*unstructured.Unstructured {
		out := make([]*unstructured.Unstructured, len(objs))
		for i, o := range objs {
			out[i] = &unstructured.Unstructured{Object: o}
		}
		return out
	}
	return engine.PoolInput{
		Pool: &unstructured.Unstructured{Object: c.Pool}, VMs: list(c.VMs), VMIs: list(c.VMIs), Volumes: list(c.Volumes),
		Now: c.Now, BurstLimit: c.Burst,
	}
}

type poolGen struct{ r *rand.Rand }

func (g poolGen) pick(options ...any) any { return options[g.r.IntN(len(options))] }

func (g poolGen) chance(p float64) bool { return g.r.Float64() < p }

func (g poolGen) selector() map[string]any {
	if g.chance(0.5) {
		return map[string]any{"matchLabels": map[string]any{"tier": g.pick("a", "b", "c")}}
	}
	e := map[string]any{"key": g.pick("tier", "zone"), "operator": g.pick("In", "NotIn", "Exists", "DoesNotExist")}
	if op := e["operator"]; op == "In" || op == "NotIn" {
		e["values"] = []any{g.pick("a", "b", "x"), g.pick("c", "y")}
	}
	return map[string]any{"matchExpressions": []any{e}}
}

func (g poolGen) selectionPolicy() map[string]any {
	p := map[string]any{}
	if g.chance(0.7) {
		p["basePolicy"] = g.pick("Oldest", "Newest", "Random", "AscendingOrder", "DescendingOrder")
	}
	if n := g.r.IntN(3); n > 0 {
		var ordered []any
		for range n {
			ordered = append(ordered, map[string]any{"labelSelector": g.selector()})
		}
		p["orderedPolicies"] = ordered
	}
	return p
}

func (g poolGen) strategy(scaleIn bool) map[string]any {
	kind := g.pick("unmanaged", "opportunistic", "proactive", "proactive").(string)
	body := map[string]any{}
	if kind == "proactive" && g.chance(0.7) {
		body["selectionPolicy"] = g.selectionPolicy()
	}
	if scaleIn && kind != "unmanaged" && g.chance(0.7) {
		body["statePreservation"] = g.pick("Disabled", "Offline")
	}
	return map[string]any{kind: body}
}

func (g poolGen) newCase() poolCase {
	uid := fmt.Sprintf("uid-%d", g.r.IntN(1000))
	template := map[string]any{"spec": map[string]any{
		"running":             true,
		"dataVolumeTemplates": []any{map[string]any{"metadata": map[string]any{"name": "root"}}},
		"template": map[string]any{"spec": map[string]any{"volumes": []any{
			map[string]any{"name": "root", "dataVolume": map[string]any{"name": "root"}},
			map[string]any{"name": "ci", "cloudInitNoCloud": map[string]any{"secretRef": map[string]any{"name": "userdata"}}},
			map[string]any{"name": "cfg", "configMap": map[string]any{"name": "app"}},
			map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": g.pick("shared", "root")}},
		}}},
	}}
	if g.chance(0.5) {
		template["metadata"] = map[string]any{"labels": map[string]any{"app": g.pick("db", "web")}}
	}
	if g.chance(0.5) { // the labels a VM updated now has, which KubeVirt's update selectors read
		template["spec"].(map[string]any)["template"].(map[string]any)["metadata"] = map[string]any{"labels": map[string]any{"tier": g.pick("a", "b", "c")}}
	}
	spec := map[string]any{"replicas": int64(g.r.IntN(13)), "template": template}
	if g.chance(0.6) {
		spec["scaleInStrategy"] = g.strategy(true)
	}
	if g.chance(0.6) {
		spec["updateStrategy"] = g.strategy(false)
	}
	if g.chance(0.6) {
		spec["maxUnavailable"] = g.pick(int64(0), int64(1), int64(3), "10%", "25%", "50%", "100%")
	}
	if g.chance(0.3) {
		spec["nameGeneration"] = map[string]any{"appendPostfixToSecretReferences": g.chance(0.5), "appendPostfixToConfigMapReferences": g.chance(0.5)}
	}
	now := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	pool := map[string]any{
		"metadata": map[string]any{"name": "p", "namespace": "ns", "uid": uid},
		"spec":     spec,
	}
	if g.chance(0.5) {
		heal := map[string]any{}
		if g.chance(0.7) {
			heal["startupFailureThreshold"] = int64(1 + g.r.IntN(3))
		}
		if g.chance(0.4) {
			heal["minFailingToStartDuration"] = g.pick("30s", "2m", "5m", "10m")
		}
		spec["autohealing"] = heal
		var records []any
		for n := 1; n <= 12; n++ {
			if g.chance(0.15) {
				records = append(records, map[string]any{
					"name": fmt.Sprintf("p-%d", n), "count": int64(1 + g.r.IntN(6)),
					"lastTime": now.Add(-time.Duration(g.r.IntN(400)) * time.Second).Format(time.RFC3339),
				})
			}
		}
		if records != nil {
			pool["status"] = map[string]any{"reprovisions": records}
		}
	}
	hash := reference.TemplateHash(template)
	// What a VMI carries when it runs the template: the whole template's hash (the design's
	// semantics) or its VMI template's (KubeVirt's); each is outdated to the other.
	vmiHash := reference.PoolVMIHash(template, reference.KubeVirtPoolSettings)
	c := poolCase{Pool: pool, Now: now, Burst: 1 + g.r.IntN(8)}
	for n := 0; n <= 15; n++ {
		if !g.chance(0.55) {
			continue
		}
		name := fmt.Sprintf("p-%d", n)
		owner := map[string]any{"apiVersion": "pool.virt-rules.io/v1alpha1", "kind": "VirtualMachinePool", "name": "p", "uid": uid, "controller": true}
		meta := map[string]any{
			"name":              name,
			"creationTimestamp": now.Add(-time.Duration(g.r.IntN(4)) * time.Second).Format(time.RFC3339),
			"labels":            map[string]any{"tier": g.pick("a", "b", "c"), "zone": g.pick("x", "y")},
			"annotations":       map[string]any{"pool.virt-rules.io/template-hash": g.pick(hash, hash, "old")},
		}
		switch {
		case g.chance(0.1): // detached
		case g.chance(0.05):
			owner["uid"] = "someone-else"
			meta["ownerReferences"] = []any{owner}
		default:
			meta["ownerReferences"] = []any{owner}
		}
		if g.chance(0.05) {
			meta["deletionTimestamp"] = now.Format(time.RFC3339)
		}
		vmSpec := map[string]any{"dataVolumeTemplates": []any{map[string]any{"metadata": map[string]any{"name": fmt.Sprintf("root-%d", n)}}}}
		if g.chance(0.6) { // KubeVirt's selectors read the VMI template's labels
			vmSpec["template"] = map[string]any{"metadata": map[string]any{"labels": map[string]any{"tier": g.pick("a", "b", "c"), "zone": g.pick("x", "y")}}}
		}
		switch g.r.IntN(4) {
		case 0:
			vmSpec["running"] = false
		case 1:
			vmSpec["runStrategy"] = g.pick("Always", "Halted", "Manual", "RerunOnFailure")
		default:
			vmSpec["running"] = true
		}
		status := map[string]any{"ready": g.chance(0.7)}
		if g.chance(0.25) {
			status["startFailure"] = map[string]any{"consecutiveFailCount": int64(g.r.IntN(5))}
		}
		if g.chance(0.25) {
			status["printableStatus"] = g.pick("CrashLoopBackOff", "ErrorUnschedulable", "ErrImagePull", "ImagePullBackOff", "DataVolumeError", "ErrorPvcNotFound", "Running", "Stopped")
			status["conditions"] = []any{map[string]any{"type": "Ready", "status": g.pick("False", "False", "True"),
				"lastProbeTime": now.Add(-time.Duration(g.r.IntN(900)) * time.Second).Format(time.RFC3339)}}
		}
		c.VMs = append(c.VMs, map[string]any{"metadata": meta, "spec": vmSpec, "status": status})
		if g.chance(0.75) {
			ready := "True"
			if g.chance(0.2) {
				ready = "False"
			}
			vmiMeta := map[string]any{"name": name, "annotations": map[string]any{"pool.virt-rules.io/template-hash": g.pick(hash, hash, vmiHash, vmiHash, "old")}}
			if g.chance(0.05) {
				vmiMeta["deletionTimestamp"] = now.Format(time.RFC3339)
			}
			c.VMIs = append(c.VMIs, map[string]any{"metadata": vmiMeta, "status": map[string]any{
				"phase": g.pick("Running", "Running", "Running", "Scheduling", "Failed", "Succeeded"), "conditions": []any{map[string]any{"type": "Ready", "status": ready}},
			}})
		}
	}
	for n := 1; n <= 15; n++ {
		if g.chance(0.12) {
			owner := uid
			if g.chance(0.3) {
				owner = "other-pool"
			}
			c.Volumes = append(c.Volumes, map[string]any{"metadata": map[string]any{
				"name":        fmt.Sprintf("root-%d-%s", n, owner),
				"labels":      map[string]any{"pool.virt-rules.io/preserved": "p"},
				"annotations": map[string]any{"pool.virt-rules.io/preserved-pool-uid": owner, "pool.virt-rules.io/preserved-vm": fmt.Sprintf("p-%d", n)},
			}})
		}
	}
	return c
}

// comparable is what both sides must agree on.
type comparablePlan struct {
	Create, Update, Restart, Reprovision []string
	Delete                               []reference.PoolDelete
	Records                              []reference.PoolRecord
	RequeueAfterSeconds                  *float64
	Replicas, Ready, Updated             int
	Volumes, DataVolumes                 map[string][]string
}

func fromEngine(p *engine.PoolPlan) comparablePlan {
	c := comparablePlan{Restart: p.Restart, RequeueAfterSeconds: p.RequeueAfterSeconds,
		Replicas: int(p.Status.Replicas), Ready: int(p.Status.ReadyReplicas), Updated: int(p.Status.UpdatedReplicas),
		Volumes: map[string][]string{}, DataVolumes: map[string][]string{}}
	for _, x := range p.Create {
		c.Create = append(c.Create, x.Name)
		c.Volumes[x.Name], c.DataVolumes[x.Name] = reference.PoolVolumeNames(x.VM)
	}
	for _, x := range p.Delete {
		c.Delete = append(c.Delete, reference.PoolDelete{Name: x.Name, PreserveState: x.PreserveState, Volumes: x.Volumes})
	}
	for _, x := range p.Update {
		c.Update = append(c.Update, x.Name)
	}
	for _, x := range p.Reprovision {
		c.Reprovision = append(c.Reprovision, x.Name)
	}
	for _, r := range p.Reprovisions {
		c.Records = append(c.Records, reference.PoolRecord{Name: r.Name, Count: int64(r.Count), LastTime: r.LastTime.UTC().Format(time.RFC3339)})
	}
	slices.SortFunc(c.Records, func(a, b reference.PoolRecord) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return c
}

func fromReference(p reference.PoolPlan) comparablePlan {
	return comparablePlan{Create: p.Create, Update: p.Update, Restart: p.Restart, Reprovision: p.Reprovision,
		Delete: p.Delete, Records: p.Records, RequeueAfterSeconds: p.RequeueAfterSeconds,
		Replicas: p.Replicas, Ready: p.ReadyReplicas, Updated: p.UpdatedReplicas,
		Volumes: p.CreateVolumes, DataVolumes: p.CreateDataVolumes}
}

// normalized makes empty and nil lists and maps compare equal.
func normalized(c comparablePlan) comparablePlan {
	raw, _ := json.Marshal(c)
	var out comparablePlan
	_ = json.Unmarshal(raw, &out)
	fix := func(s []string) []string {
		if len(s) == 0 {
			return nil
		}
		return s
	}
	out.Create, out.Update, out.Restart, out.Reprovision = fix(out.Create), fix(out.Update), fix(out.Restart), fix(out.Reprovision)
	if len(out.Delete) == 0 {
		out.Delete = nil
	}
	if len(out.Records) == 0 {
		out.Records = nil
	}
	if len(out.Volumes) == 0 {
		out.Volumes, out.DataVolumes = nil, nil
	}
	return out
}

// poolEngine serves the embedded bundle with the pool's settings.semantics set to semantics,
// and returns the reference's settings for it.
func poolEngine(t *testing.T, semantics string) (*engine.Engine, reference.PoolSettings) {
	t.Helper()
	ctx := context.Background()
	if semantics == "default" {
		eng, err := engine.New(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return eng, reference.DefaultPoolSettings
	}
	dir := bundleDir(t, func(dir string) {
		file := filepath.Join(dir, "virtrules", "pool", "data.json")
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var data map[string]any
		if err := json.Unmarshal(raw, &data); err != nil {
			t.Fatal(err)
		}
		data["settings"].(map[string]any)["semantics"] = semantics
		out, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, file, string(out))
	})
	eng, err := engine.New(ctx, engine.WithBundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	return eng, reference.KubeVirtPoolSettings
}

func TestPoolDifferential(t *testing.T) {
	for _, semantics := range []string{"default", "kubevirt"} {
		t.Run(semantics, func(t *testing.T) { poolDifferential(t, semantics) })
	}
}

func poolDifferential(t *testing.T, semantics string) {
	seed := *poolSeed
	t.Logf("seed %d (rerun with -pool.seed=%d)", seed, seed)
	ctx := context.Background()
	eng, settings := poolEngine(t, semantics)
	g := poolGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	covered := map[string]int{}
	for i := range *poolCases {
		c := g.newCase()
		got, err := eng.PoolPlan(ctx, c.input())
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		want := reference.PlanPool(c.Pool, c.VMs, c.VMIs, c.Volumes, c.Now, c.Burst, settings)
		g, w := normalized(fromEngine(got)), normalized(fromReference(want))
		if !reflect.DeepEqual(g, w) {
			in, _ := json.MarshalIndent(c, "", "  ")
			gj, _ := json.MarshalIndent(g, "", "  ")
			wj, _ := json.MarshalIndent(w, "", "  ")
			t.Fatalf("case %d: engine and reference disagree\ninput:\n%s\nengine:\n%s\nreference:\n%s", i, in, gj, wj)
		}
		for what, hit := range map[string]bool{
			"create": len(want.Create) > 0, "delete": len(want.Delete) > 0, "delete keeping state": slices.ContainsFunc(want.Delete, func(d reference.PoolDelete) bool { return d.PreserveState }),
			"update": len(want.Update) > 0, "restart": len(want.Restart) > 0, "reprovision": len(want.Reprovision) > 0,
			"backoff wait": want.RequeueAfterSeconds != nil && *want.RequeueAfterSeconds > 0, "burst capped": want.RequeueAfterSeconds != nil && *want.RequeueAfterSeconds == 0,
			"kept name reused": len(want.Create) > 0 && slices.ContainsFunc(c.Volumes, func(v map[string]any) bool {
				a := v["metadata"].(map[string]any)["annotations"].(map[string]any)
				return a["pool.virt-rules.io/preserved-pool-uid"] == c.Pool["metadata"].(map[string]any)["uid"] && slices.Contains(want.Create, a["pool.virt-rules.io/preserved-vm"].(string))
			}),
		} {
			if hit {
				covered[what]++
			}
		}
	}
	t.Logf("%d cases: %v", *poolCases, covered)
	for _, what := range []string{"create", "delete", "delete keeping state", "update", "restart", "reprovision", "backoff wait", "burst capped", "kept name reused"} {
		if covered[what] == 0 {
			t.Errorf("no generated case exercised %q; the generator needs adjusting", what)
		}
	}
}
