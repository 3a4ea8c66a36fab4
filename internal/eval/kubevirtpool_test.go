package eval_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// runKubeVirtPools decides stream, pools of KubeVirt's among its objects, and the warnings.
func runKubeVirtPools(t *testing.T, stream string) (*eval.Report, []string) {
	t.Helper()
	ctx := context.Background()
	eng, err := engine.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Parse("pools.yaml", strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	var warnings []string
	r, err := eval.Run(ctx, eng, objs, eval.Options{Warn: func(s string) { warnings = append(warnings, s) }})
	if err != nil {
		t.Fatal(err)
	}
	return r, warnings
}

// kubevirtPool is a pool.kubevirt.io pool named name in namespace shop, with spec lines
// (indented as spec's fields) after its template.
func kubevirtPool(version, name, spec string) string {
	return fmt.Sprintf(`apiVersion: pool.kubevirt.io/%s
kind: VirtualMachinePool
metadata: {name: %s, namespace: shop, uid: uid-%s}
spec:
  selector: {matchLabels: {app: %s}}
  virtualMachineTemplate:
    metadata: {labels: {app: %s}}
    spec:
      runStrategy: Always
      template: {spec: {domain: {devices: {}, memory: {guest: 1Gi}}}}
%s`, version, name, name, name, name, spec)
}

func poolNamed(t *testing.T, r *eval.Report, key string) eval.PoolResult {
	t.Helper()
	for _, p := range r.Pools {
		if p.Pool == key {
			return p
		}
	}
	t.Fatalf("no pool %s among %+v", key, r.Pools)
	return eval.PoolResult{}
}

// The example a cluster holds: the VM of the revision now is kept, the one of an older
// revision and the one whose revision is gone are updated, the missing replica created.
func TestKubeVirtPoolPreview(t *testing.T) {
	data, err := os.ReadFile("../../examples/kubevirt-pool/pool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, warnings := runKubeVirtPools(t, string(data))
	p := poolNamed(t, r, "shop/web")
	if !p.Preview || p.APIVersion != "pool.kubevirt.io/v1beta1" {
		t.Errorf("pool %+v: want a preview of a pool.kubevirt.io/v1beta1 pool", p)
	}
	got := fmt.Sprint(p.Create, p.Delete, p.Update, p.Restart, p.Reprovision)
	if want := "[web-3] [] [web-1 web-2] [web-1 web-2] []"; got != want {
		t.Errorf("create, delete, update, restart, reprovision %s, want %s", got, want)
	}
	if len(r.Errors) != 0 {
		t.Errorf("errors %v", r.Errors)
	}
	missing := slices.IndexFunc(warnings, func(w string) bool {
		return strings.Contains(w, "ControllerRevision shop/web-1, named by web-2") && strings.Contains(w, "previewed as outdated")
	})
	if missing < 0 {
		t.Errorf("warnings %q: want one for the missing revision web-1", warnings)
	}
}

// Each pool KubeVirt's controller would not plan is said so; each pool the preview cannot
// plan is one error naming KubeVirt's field at its line; the others are previewed.
func TestKubeVirtPoolPreviewErrors(t *testing.T) {
	stream := strings.Join([]string{
		kubevirtPool("v1beta1", "paused", "  replicas: 2\n  paused: true\n"),
		kubevirtPool("v1alpha1", "old", "  replicas: 1\n"),
		kubevirtPool("v1beta1", "typo", "  replicas: three\n"),
		kubevirtPool("v1beta1", "nodes", `  replicas: 1
  scaleInStrategy:
    proactive:
      selectionPolicy:
        selectors:
          nodeSelectorRequirementMatcher: [{key: zone, operator: In, values: [a]}]
`),
		kubevirtPool("v1beta1", "online", `  replicas: 1
  scaleInStrategy:
    proactive:
      statePreservation: Online
      selectionPolicy: {sortPolicy: Newest}
`),
		`apiVersion: apps/v1
kind: ControllerRevision
metadata:
  name: agent-5d8f
  namespace: kube-system
  ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: agent, uid: u1, controller: true}]
revision: 1
data: {spec: {}}
`,
	}, "---\n")
	r, warnings := runKubeVirtPools(t, stream)

	paused := poolNamed(t, r, "shop/paused")
	if !paused.Preview || len(paused.Create) != 0 || !strings.Contains(paused.Message, "paused") {
		t.Errorf("paused pool %+v: want a preview planning nothing, saying why", paused)
	}
	old := poolNamed(t, r, "shop/old")
	if old.APIVersion != "pool.kubevirt.io/v1alpha1" || !slices.Equal(old.Create, []string{"old-0"}) {
		t.Errorf("v1alpha1 pool %+v: want old-0 created", old)
	}
	want := []string{
		fmt.Sprintf(`pools.yaml:%d: VirtualMachinePool shop/typo: spec.replicas: KubeVirt's VirtualMachinePool type refuses it: want int32, not a JSON string`, lineOf(t, stream, "replicas: three")),
		fmt.Sprintf(`pools.yaml:%d: VirtualMachinePool shop/nodes: spec.scaleInStrategy.proactive.selectionPolicy.selectors.nodeSelectorRequirementMatcher: the pool decision has no node selector matcher yet, so it cannot preview which VMs KubeVirt takes`, lineOf(t, stream, "nodeSelectorRequirementMatcher")),
	}
	if got := errorLines(r.Errors); !slices.Equal(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	reasons := map[string]string{}
	for _, e := range r.Errors {
		reasons[e.Name] = e.Reason
	}
	if reasons["nodes"] != manifest.ReasonUnsupported || reasons["typo"] != manifest.ReasonInvalid {
		t.Errorf("reasons %v: want nodes Unsupported, typo Invalid", reasons)
	}
	// Online keeps the PVCs as Offline does in KubeVirt's controller: previewed.
	if online := poolNamed(t, r, "shop/online"); !slices.Equal(online.Create, []string{"online-0"}) {
		t.Errorf("online pool %+v: want online-0 created", online)
	}
	for _, name := range []string{"shop/nodes", "shop/typo"} {
		for _, p := range r.Pools {
			if p.Pool == name {
				t.Errorf("%s in error, yet planned: %+v", name, p)
			}
		}
	}
	// Another controller's revision is no decision's: said once, like any kind none reads.
	if !slices.ContainsFunc(warnings, func(w string) bool {
		return strings.Contains(w, "ignoring apps/v1 ControllerRevision kube-system/agent-5d8f: no decision reads it")
	}) {
		t.Errorf("warnings %q: want the DaemonSet's revision ignored", warnings)
	}
}

// KubeVirt's names for the fields of virt-rules' translation.
func TestKubeVirtPoolField(t *testing.T) {
	for in, want := range map[string]string{
		"spec.template.spec.running": "spec.virtualMachineTemplate.spec.running",
		"spec.templates":             "spec.templates",
		"spec.updateStrategy.proactive.selectionPolicy.basePolicy":                                    "spec.updateStrategy.proactive.selectionPolicy.sortPolicy",
		"spec.scaleInStrategy.proactive.selectionPolicy.orderedPolicies[0].labelSelector.matchLabels": "spec.scaleInStrategy.proactive.selectionPolicy.selectors.labelSelector.matchLabels",
		"spec.autohealing.startupFailureThreshold":                                                    "spec.autohealing.startUpFailureThreshold",
		"spec.replicas": "spec.replicas",
	} {
		if got := eval.KubeVirtPoolField(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// A revision the preview cannot read is its own error; its VMs are previewed as outdated.
func TestKubeVirtPoolPreviewBadRevision(t *testing.T) {
	stream := strings.Join([]string{
		kubevirtPool("v1beta1", "web", "  replicas: 1\n"),
		`apiVersion: apps/v1
kind: ControllerRevision
metadata:
  name: web-1
  namespace: shop
  ownerReferences: [{apiVersion: pool.kubevirt.io/v1beta1, kind: VirtualMachinePool, name: web, uid: uid-web, controller: true}]
revision: 1
data:
  virtualMachineTemplate: {spec: {runStrategy: 7}}
`,
		`apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: web-0
  namespace: shop
  labels: {kubevirt.io/vm-pool-revision-name: web-1}
  ownerReferences: [{apiVersion: pool.kubevirt.io/v1beta1, kind: VirtualMachinePool, name: web, uid: uid-web, controller: true}]
spec: {runStrategy: Always, template: {spec: {domain: {devices: {}}}}}
status: {ready: true}
`,
	}, "---\n")
	r, _ := runKubeVirtPools(t, stream)
	want := []string{fmt.Sprintf(`pools.yaml:%d: ControllerRevision shop/web-1: data.virtualMachineTemplate.spec.runStrategy: KubeVirt's VirtualMachinePool type refuses it: want v1.VirtualMachineRunStrategy, not a JSON number`, lineOf(t, stream, "runStrategy: 7"))}
	if got := errorLines(r.Errors); !slices.Equal(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if p := poolNamed(t, r, "shop/web"); !slices.Equal(p.Update, []string{"web-0"}) {
		t.Errorf("pool %+v: want web-0 updated (its revision unreadable)", p)
	}
}
