package scale_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	eventrecord "k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	virtrego "github.com/virt-rules/virt-rules/rego"
	"github.com/virt-rules/virt-rules/test/reference"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// The MigrationPolicies: five per team, of rising precedence for a VMI of the team (design
// 000: more matching labels win):
//
//	base        VMI {team}                             bandwidth 64Mi
//	staging     VMI {team}, namespace {env: staging}   bandwidth 32Mi
//	prod        VMI {team}, namespace {env: prod}      bandwidth 256Mi
//	large       VMI {team, size: large}                bandwidth 128Mi, completionTimeoutPerGiB 200
//	large-prod  VMI {team, size: large}, ns {env: prod} bandwidth 512Mi, allowAutoConverge
//
// So a policy change touches one team's VMIs, a namespace relabel (prod to staging) that
// namespace's VMIs, and a KubeVirt CR change (completionTimeoutPerGiB) every VMI whose policy
// does not set it.
const policiesPerTeam = 5

func numTeams() int { return numPolicies / policiesPerTeam }

func team(i int) string { return fmt.Sprintf("t%03d", i) }

// policyObjects are the MigrationPolicies of every team.
func policyObjects() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for t := range numTeams() {
		tm := team(t)
		small, large := map[string]any{"team": tm}, map[string]any{"team": tm, "size": "large"}
		out = append(out,
			policyObject(tm+"-base", small, nil, map[string]any{"bandwidthPerMigration": "64Mi"}),
			policyObject(tm+"-staging", small, map[string]any{"env": "staging"}, map[string]any{"bandwidthPerMigration": "32Mi"}),
			policyObject(tm+"-prod", small, map[string]any{"env": "prod"}, map[string]any{"bandwidthPerMigration": "256Mi"}),
			policyObject(tm+"-large", large, nil, map[string]any{"bandwidthPerMigration": "128Mi", "completionTimeoutPerGiB": int64(200)}),
			policyObject(tm+"-large-prod", large, map[string]any{"env": "prod"}, map[string]any{"bandwidthPerMigration": "512Mi", "allowAutoConverge": true}),
		)
	}
	return out
}

func policyObject(name string, vmi, ns map[string]any, spec map[string]any) *unstructured.Unstructured {
	p := kinds.NewObject(kinds.MigrationPolicy)
	p.SetName(name)
	selectors := map[string]any{"virtualMachineInstanceSelector": vmi}
	if ns != nil {
		selectors["namespaceSelector"] = ns
	}
	s := map[string]any{"selectors": selectors}
	for k, v := range spec {
		s[k] = v
	}
	p.Object["spec"] = s
	return p
}

// namespaceName is namespace i of the VMIs; even ones are prod, odd ones staging.
func namespaceName(i int) string { return fmt.Sprintf("scale-%02d", i) }

func namespaceEnv(i int) string {
	if i%2 == 0 {
		return "prod"
	}
	return "staging"
}

// createNamespaces creates the VMIs' namespaces, labelled env, and the pools'.
func createNamespaces() {
	GinkgoHelper()
	for i := range numNamespaces {
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaceName(i), Labels: map[string]string{"env": namespaceEnv(i)}}})).To(Succeed())
	}
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: poolNamespace}})).To(Succeed())
}

// vmiObject is VMI i: in namespace i%numNamespaces, of team i%numTeams, one in three large.
// Its disk is a PersistentVolumeClaim that is never created, so virt-controller keeps it
// Pending (FailedPvcNotFound) and makes no virt-launcher pod for it: KubeVirt's mutating
// webhook drops any status a VMI is created with, and 10,000 launcher pods would measure
// kube-scheduler and kwok rather than virt-rules. A MigrationPolicy decision does not read the
// phase.
func vmiObject(prefix string, i int) *unstructured.Unstructured {
	size := "small"
	if i%3 == 0 {
		size = "large"
	}
	vmi := kinds.NewObject(kinds.VirtualMachineInstance)
	vmi.SetNamespace(namespaceName(i % numNamespaces))
	vmi.SetName(fmt.Sprintf("%s-%05d", prefix, i))
	vmi.SetLabels(map[string]string{"team": team(i % numTeams()), "size": size})
	vmi.Object["spec"] = map[string]any{
		"domain": map[string]any{
			"devices":   map[string]any{"disks": []any{map[string]any{"name": "root", "disk": map[string]any{"bus": "virtio"}}}},
			"resources": map[string]any{"requests": map[string]any{"memory": "64Mi"}},
		},
		"volumes": []any{map[string]any{"name": "root", "persistentVolumeClaim": map[string]any{"claimName": "never-created"}}},
	}
	return vmi
}

// vmiDecision is what the migrationpolicy controller writes on a VMI: its policy annotation
// ("-" when absent) and its configuration annotation, re-encoded so that equal
// configurations compare equal.
func vmiDecision(m *metav1.PartialObjectMetadata) string {
	policy, ok := m.Annotations[migrationpolicy.AnnotationPolicy]
	if !ok {
		policy = "-"
	}
	raw, ok := m.Annotations[migrationpolicy.AnnotationConfiguration]
	if !ok {
		return policy + " (no configuration)"
	}
	var cfg kubevirtv1.VMIMConfigurationOptions
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return policy + " " + strconv.Quote(raw)
	}
	return decisionValue(policy, cfg)
}

func decisionValue(policy string, cfg kubevirtv1.VMIMConfigurationOptions) string {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return policy + " " + err.Error()
	}
	return policy + " " + string(raw)
}

// droppedFields are the configuration fields the cluster's KubeVirt (the CR's
// status.observedKubeVirtVersion) does not store, by the bundle's settings.since: the decision
// leaves them out, as the reference does not know.
func droppedFields(dataJSON []byte, kubevirt *unstructured.Unstructured) []string {
	GinkgoHelper()
	var data struct {
		Settings struct {
			Since map[string]string `json:"since"`
		} `json:"settings"`
	}
	Expect(json.Unmarshal(dataJSON, &data)).To(Succeed())
	observed, _, _ := unstructured.NestedString(kubevirt.Object, "status", "observedKubeVirtVersion")
	running, err := version.ParseSemantic(strings.TrimPrefix(observed, "v"))
	if err != nil {
		return nil // an unknown version gets every field
	}
	var dropped []string
	for field, since := range data.Settings.Since {
		if v, err := version.ParseSemantic(since); err == nil && running.LessThan(v) {
			dropped = append(dropped, field)
		}
	}
	return dropped
}

// withoutFields is cfg without the fields named (by their JSON names).
func withoutFields(cfg kubevirtv1.VMIMConfigurationOptions, fields []string) kubevirtv1.VMIMConfigurationOptions {
	GinkgoHelper()
	if len(fields) == 0 {
		return cfg
	}
	raw, err := json.Marshal(cfg)
	Expect(err).NotTo(HaveOccurred())
	var m map[string]any
	Expect(json.Unmarshal(raw, &m)).To(Succeed())
	for _, f := range fields {
		delete(m, f)
	}
	raw, err = json.Marshal(m)
	Expect(err).NotTo(HaveOccurred())
	var out kubevirtv1.VMIMConfigurationOptions
	Expect(json.Unmarshal(raw, &out)).To(Succeed())
	return out
}

// expectDecisions sets, and returns, what every VMI the tracker holds must carry by the
// reference implementation, from the cluster as it is now: the policies, the KubeVirt CR and
// every namespace's labels.
func expectDecisions() map[string]string {
	GinkgoHelper()
	raw, err := fs.ReadFile(virtrego.Bundle(), "virtrules/migration/policy/data.json")
	Expect(err).NotTo(HaveOccurred())
	settings, err := reference.ParseSettings(raw)
	Expect(err).NotTo(HaveOccurred())
	list := kinds.NewList(kinds.MigrationPolicy)
	Expect(k8s.List(ctx, list)).To(Succeed())
	objs := make([]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		objs[i] = &list.Items[i]
	}
	policies, err := reference.PoliciesFromUnstructured(objs, settings.PolicyFields)
	Expect(err).NotTo(HaveOccurred())
	kv := kubevirtCR()
	clusterCfg, err := reference.ClusterConfiguration(kv)
	Expect(err).NotTo(HaveOccurred())
	dropped := droppedFields(raw, kv)
	var namespaces corev1.NamespaceList
	Expect(k8s.List(ctx, &namespaces)).To(Succeed())
	nsLabels := map[string]map[string]string{}
	for _, ns := range namespaces.Items {
		nsLabels[ns.Name] = ns.Labels
		if nsLabels[ns.Name] == nil {
			nsLabels[ns.Name] = map[string]string{}
		}
	}
	// Policies by team: every policy requires a team, so only those of a VMI's team can match.
	byTeam := map[string][]reference.Policy{}
	for _, p := range policies {
		byTeam[p.VMI["team"]] = append(byTeam[p.VMI["team"]], p)
	}
	want := map[string]string{}
	for _, m := range vmis.snapshot() {
		d := reference.Decide(byTeam[m.Labels["team"]], reference.VMI{Namespace: m.Namespace, Labels: m.Labels, NamespaceLabels: nsLabels[m.Namespace]}, settings, clusterCfg)
		policy := d.Policy
		if policy == "" {
			policy = "-"
		}
		want[keyOf(m)] = decisionValue(policy, withoutFields(d.Configuration, dropped))
	}
	vmis.expect(want)
	return want
}

func kubevirtCR() *unstructured.Unstructured {
	GinkgoHelper()
	kv := kinds.NewObject(kinds.KubeVirt)
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: testcluster.Namespace, Name: testcluster.KubeVirtName}, kv)).To(Succeed())
	return kv
}

// createAll creates the objects with inFlight requests at a time and returns how long it took.
func createAll(inFlight int, objs []*unstructured.Unstructured) time.Duration {
	GinkgoHelper()
	start := time.Now()
	Expect(parallelOn(inFlight, len(objs), func(i int) error {
		if err := k8s.Create(ctx, objs[i]); err != nil {
			return fmt.Errorf("create %s %s: %w", objs[i].GetKind(), client.ObjectKeyFromObject(objs[i]), err)
		}
		return nil
	})).To(Succeed())
	return time.Since(start)
}

// matchable counts the VMIs the tracker holds that carry every label of the policy's VMI
// selector: those a change of the policy can concern (its namespace selector aside).
func matchable(vmiSelector map[string]string) int {
	n := 0
	for _, m := range vmis.snapshot() {
		ok := true
		for k, v := range vmiSelector {
			if m.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// vmiPatchFloor merge-patches an annotation of this test's own onto n of the VMIs, inFlight at
// a time, and records an Event on each as the controller does on each VMI it writes (client-go's
// event recorder, which sends them in the background), and returns how long the patches took:
// what the API server and the VMI admission webhooks need for as many VMI writes, with their
// Events, as a change made the controller write. They are timed, as the controller's are, until
// the harness's watch of VMIs saw the last of them.
func vmiPatchFloor(n, inFlight int) time.Duration {
	GinkgoHelper()
	vmiFloorRuns++
	value := strconv.Itoa(vmiFloorRuns)
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, floorMark, value))
	list := vmis.snapshot()
	list = list[:min(n, len(list))]
	keys := make([]string, len(list))
	for i, m := range list {
		keys[i] = keyOf(m)
	}
	recorder := floorRecorder()
	start := time.Now()
	Expect(parallelOn(inFlight, len(list), func(i int) error {
		vmi := kinds.NewObject(kinds.VirtualMachineInstance)
		vmi.SetNamespace(list[i].Namespace)
		vmi.SetName(list[i].Name)
		vmi.SetUID(list[i].UID)
		if err := k8s.Patch(ctx, vmi, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return err
		}
		recorder.Eventf(vmi, corev1.EventTypeNormal, "FloorPatched", "floor run %d (was %d)", vmiFloorRuns, vmiFloorRuns-1)
		return nil
	})).To(Succeed())
	return vmis.floorSeen(keys, value).Sub(start)
}

// floorRecorder is the floor's event recorder, made once, as a controller's manager makes one.
var floorRecorder = sync.OnceValue(func() eventrecord.EventRecorder {
	cs, err := kubernetes.NewForConfig(fastCfg)
	Expect(err).NotTo(HaveOccurred())
	broadcaster := eventrecord.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	// It lives as long as the harness: the floors of several specs send through it.
	return broadcaster.NewRecorder(k8s.Scheme(), corev1.EventSource{Component: "virt-rules-scale-floor"})
})

// vmiFloorRuns numbers the floor measurements, so each changes its annotation.
var vmiFloorRuns int

// sampledFloor is the median of three floorAfter(n, measure). The same writes took from 0.6 to
// 1.2 s from one run to the next on two shared cores, so one measurement is not a floor to hold
// a bound to; how says how it was taken, for the table.
func sampledFloor(n int, measure func(n int) time.Duration) (time.Duration, string) {
	var runs []time.Duration
	how := ""
	for range 3 {
		var d time.Duration
		d, how = floorAfter(n, measure)
		runs = append(runs, d)
	}
	median, spelt := medianOf(runs)
	return median, how + ", the median of " + spelt
}

// floorAfter is measure(n) once the cluster settled, as a change is timed (the writes before
// it reconciled too), or for n over floorSample, measure(floorSample) scaled by n/floorSample:
// writes at a fixed number in flight take time in proportion to their number. how says which.
func floorAfter(n int, measure func(n int) time.Duration) (time.Duration, string) {
	m, how := n, ""
	if n > floorSample {
		m, how = floorSample, fmt.Sprintf(" (measured on %d, scaled)", floorSample)
	}
	settled()
	return time.Duration(float64(measure(m)) * float64(n) / float64(m)), how
}
