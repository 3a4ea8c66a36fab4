package reference

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The VirtualMachinePool plan (design 003 as issue 5 states its rules), written the plain Go
// way: loops, maps and sort.Slice over the objects as stored. It answers what the Rego
// decision answers (rego/virtrules/pool), for well-formed pools; the differential test
// compares the two over generated pools.

// PoolSettings are the pool decision's bundle data.
type PoolSettings struct {
	// Prefer is the Random base policy's order of states: "stopped", "notReady", "ready".
	Prefer                []string
	InitialBackoffSeconds int64
	MaxBackoffSeconds     int64
	MaxUnavailableFloor   int64
	// Semantics is "default" (design 003) or "kubevirt" (KubeVirt v1.9.0's pool controller).
	Semantics string
}

// DefaultPoolSettings are the settings the bundle ships.
var DefaultPoolSettings = PoolSettings{Prefer: []string{"stopped", "notReady"}, InitialBackoffSeconds: 10, MaxBackoffSeconds: 300, MaxUnavailableFloor: 1, Semantics: "default"}

// KubeVirtPoolSettings are the shipped settings with semantics: kubevirt.
var KubeVirtPoolSettings = func() PoolSettings { s := DefaultPoolSettings; s.Semantics = "kubevirt"; return s }()

// failingToStart are the VM printable statuses KubeVirt's autohealing replaces after
// minFailingToStartDuration.
var failingToStart = map[string]bool{"CrashLoopBackOff": true, "ErrorUnschedulable": true, "ErrImagePull": true,
	"ImagePullBackOff": true, "DataVolumeError": true, "ErrorPvcNotFound": true}

// PoolDelete is one VM removed by scale-in.
type PoolDelete struct {
	Name          string
	PreserveState bool
	Volumes       []string
}

// PoolRecord is an autohealing record.
type PoolRecord struct {
	Name     string
	Count    int64
	LastTime string
}

// PoolPlan is the reference's plan. Create, Delete and Update are in the order the plan gives
// them; Restart and Reprovision are sorted.
type PoolPlan struct {
	Create              []string
	CreateVolumes       map[string][]string // created VM -> the names its volumes reference
	CreateDataVolumes   map[string][]string // created VM -> its DataVolumeTemplate names
	Delete              []PoolDelete
	Update              []string
	Restart             []string
	Reprovision         []string
	Records             []PoolRecord // sorted by name
	RequeueAfterSeconds *float64
	Replicas            int
	ReadyReplicas       int
	UpdatedReplicas     int
}

const (
	poolHashAnnotation = "pool.virt-rules.io/template-hash"
	preservedPoolUID   = "pool.virt-rules.io/preserved-pool-uid"
	preservedVM        = "pool.virt-rules.io/preserved-vm"
)

var ordinalSuffix = regexp.MustCompile(`^[1-9][0-9]*$`)

// TemplateHash is the hash of a pool's spec.template the VMs carry.
func TemplateHash(template any) string {
	raw, _ := json.Marshal(template)
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])[:16]
}

// PoolVMIHash is the hash a VM's VMI template carries, which tells whether its VMI runs the
// pool's template (spec.template of a pool): TemplateHash(template) with the design's
// semantics; with KubeVirt's, that of the VMI template (template.spec.template) alone.
func PoolVMIHash(template map[string]any, s PoolSettings) string {
	if s.Semantics != "kubevirt" {
		return TemplateHash(template)
	}
	vmi, _ := get(template, "spec", "template").(map[string]any)
	if vmi == nil {
		vmi = map[string]any{}
	}
	return TemplateHash(vmi)
}

type poolVM struct {
	obj                    map[string]any
	name                   string
	ordinal                int // 0 also when the name has none: hasOrdinal tells
	hasOrdinal             bool
	templateLabels         map[string]string // the VMI template's, which KubeVirt's selectors read
	failingSince           *time.Time        // the Ready=False condition's lastProbeTime, if failing to start
	active, stopped, ready bool
	reportedReady          bool // status.ready: what KubeVirt reports of the VM
	current                bool
	restartable            bool
	created                int64
	labels                 map[string]string
	failures               int64
	dataVolumes            []string
	group, tier            int
	rank                   string
	vmiHash                string
}

// PlanPool plans pool over vms, vmis and volumes (kept DataVolumes) at now.
func PlanPool(pool map[string]any, vms, vmis, volumes []map[string]any, now time.Time, burst int, s PoolSettings) PoolPlan {
	name := str(pool, "metadata", "name")
	uid := str(pool, "metadata", "uid")
	spec, _ := pool["spec"].(map[string]any)
	replicas := int(num(spec, "replicas"))
	template, _ := spec["template"].(map[string]any)
	if template == nil {
		template = map[string]any{}
	}
	hash := TemplateHash(template)
	prefix := name + "-"
	kubevirt := s.Semantics == "kubevirt"
	first := 1
	if kubevirt {
		first = 0
	}
	// ordinalOf is the number of "<pool>-<n>" (from first), -1 for other names.
	ordinalOf := func(vmName string) int {
		suffix, ok := strings.CutPrefix(vmName, prefix)
		if !ok {
			return -1
		}
		if kubevirt && suffix == "0" {
			return 0
		}
		if !ordinalSuffix.MatchString(suffix) {
			return -1
		}
		n, _ := strconv.Atoi(suffix)
		return n
	}

	vmiByName := map[string]map[string]any{}
	for _, vmi := range vmis {
		vmiByName[str(vmi, "metadata", "name")] = vmi
	}
	alive := map[string]*poolVM{}
	var aliveNames []string
	held := map[string]bool{}
	owned := 0 // the pool's VMs, those being deleted too
	for _, vm := range vms {
		vmName := str(vm, "metadata", "name")
		held[vmName] = true
		if ownedByPool(vm, uid) {
			owned++
		}
		if !ownedByPool(vm, uid) || has(vm, "metadata", "deletionTimestamp") {
			continue
		}
		v := &poolVM{obj: vm, name: vmName, ordinal: max(0, ordinalOf(vmName)), hasOrdinal: ordinalOf(vmName) >= 0}
		vmi, hasVMI := vmiByName[vmName]
		if hasVMI {
			phase := str(vmi, "status", "phase")
			v.active = phase != "Succeeded" && phase != "Failed" && !has(vmi, "metadata", "deletionTimestamp")
			v.vmiHash = str(vmi, "metadata", "annotations", poolHashAnnotation)
		}
		running, _ := get(vm, "spec", "running").(bool)
		strategy := str(vm, "spec", "runStrategy")
		wants := running || strategy == "Always" || strategy == "RerunOnFailure" || strategy == "Once"
		v.stopped = !v.active && !wants
		v.restartable = running || strategy == "Always" || strategy == "RerunOnFailure"
		ready, _ := get(vm, "status", "ready").(bool)
		v.reportedReady = ready
		v.ready = ready && v.active && vmiReady(vmi)
		v.current = str(vm, "metadata", "annotations", poolHashAnnotation) == hash
		ts := str(vm, "metadata", "creationTimestamp")
		if ts == "" {
			ts = "1970-01-01T00:00:00Z"
		}
		t, _ := time.Parse(time.RFC3339, ts)
		v.created = t.UnixNano()
		v.labels = map[string]string{}
		if labels, ok := get(vm, "metadata", "labels").(map[string]any); ok {
			for k, val := range labels {
				v.labels[k], _ = val.(string)
			}
		}
		v.templateLabels = map[string]string{}
		if labels, ok := get(vm, "spec", "template", "metadata", "labels").(map[string]any); ok {
			for k, val := range labels {
				v.templateLabels[k], _ = val.(string)
			}
		}
		if failingToStart[str(vm, "status", "printableStatus")] {
			conditions, _ := get(vm, "status", "conditions").([]any)
			for _, c := range conditions {
				m, _ := c.(map[string]any)
				if m["type"] == "Ready" && m["status"] == "False" {
					if t, err := time.Parse(time.RFC3339, str(m, "lastProbeTime")); err == nil {
						v.failingSince = &t
					}
				}
			}
		}
		v.failures = int64(num(vm, "status", "startFailure", "consecutiveFailCount"))
		if dvts, ok := get(vm, "spec", "dataVolumeTemplates").([]any); ok {
			for _, d := range dvts {
				v.dataVolumes = append(v.dataVolumes, str(d.(map[string]any), "metadata", "name"))
			}
		}
		slices.Sort(v.dataVolumes)
		v.rank = randomRank(uid, vmName)
		v.tier = len(s.Prefer)
		for i, state := range s.Prefer {
			if (state == "stopped" && v.stopped) || (state == "notReady" && !v.ready) || (state == "ready" && v.ready) {
				v.tier = i
				break
			}
		}
		alive[vmName] = v
		aliveNames = append(aliveNames, vmName)
	}

	preservedOurs := map[string]bool{}
	for _, vol := range volumes {
		owner, vmName := str(vol, "metadata", "annotations", preservedPoolUID), str(vol, "metadata", "annotations", preservedVM)
		if owner == "" || vmName == "" {
			continue
		}
		if owner == uid {
			preservedOurs[vmName] = true
		} else {
			held[vmName] = true
		}
	}

	kind := func(field string) (string, map[string]any) {
		strategy, ok := spec[field].(map[string]any)
		if !ok {
			return "proactive", map[string]any{}
		}
		for _, k := range []string{"unmanaged", "opportunistic", "proactive"} {
			if v, ok := strategy[k]; ok {
				m, _ := v.(map[string]any)
				return k, m
			}
		}
		return "", nil
	}
	order := func(names []string, policy map[string]any) []string {
		ordered, _ := policy["orderedPolicies"].([]any)
		base, _ := policy["basePolicy"].(string)
		if base == "" {
			base = "Random"
		}
		out := slices.Clone(names)
		for _, n := range out {
			v := alive[n]
			v.group = len(ordered)
			if kubevirt {
				v.group = 0 // KubeVirt's selectors filter (selectable), they do not order
				continue
			}
			for i, p := range ordered {
				sel, _ := p.(map[string]any)["labelSelector"].(map[string]any)
				if sel != nil && labelSelectorMatches(sel, v.labels) {
					v.group = i
					break
				}
			}
		}
		slices.SortStableFunc(out, func(a, b string) int {
			va, vb := alive[a], alive[b]
			if va.group != vb.group {
				return va.group - vb.group
			}
			switch base {
			case "Oldest", "Newest":
				ca, cb, oa, ob := va.created, vb.created, va.ordinal, vb.ordinal
				if base == "Newest" {
					ca, cb, oa, ob = -ca, -cb, -oa, -ob
				}
				if ca != cb {
					return cmpInt64(ca, cb)
				}
				if oa != ob {
					return oa - ob
				}
			case "AscendingOrder", "DescendingOrder":
				oa, ob := va.ordinal, vb.ordinal
				if base == "DescendingOrder" {
					oa, ob = -oa, -ob
				}
				if oa != ob {
					return oa - ob
				}
			default:
				if va.tier != vb.tier {
					return va.tier - vb.tier
				}
				if c := strings.Compare(va.rank, vb.rank); c != 0 {
					return c
				}
			}
			return strings.Compare(a, b)
		})
		return out
	}

	// selects tells whether a policy lets scale-in or updates take a VM whose VMI template
	// has labels: any, except with KubeVirt's semantics and ordered selectors, where one of
	// them must match.
	selects := func(policy map[string]any, labels map[string]string) bool {
		ordered, _ := policy["orderedPolicies"].([]any)
		if !kubevirt || len(ordered) == 0 {
			return true
		}
		for _, p := range ordered {
			sel, _ := p.(map[string]any)["labelSelector"].(map[string]any)
			if sel != nil && labelSelectorMatches(sel, labels) {
				return true
			}
		}
		return false
	}
	selectable := func(names []string, policy map[string]any) []string {
		var out []string
		for _, n := range names {
			if selects(policy, alive[n].templateLabels) {
				out = append(out, n)
			}
		}
		return out
	}

	plan := PoolPlan{CreateVolumes: map[string][]string{}, CreateDataVolumes: map[string][]string{}}

	// Scale-in.
	scaleKind, scaleIn := kind("scaleInStrategy")
	preserve := scaleIn["statePreservation"] == "Offline"
	var candidates []string
	for _, n := range aliveNames {
		// Opportunistic: the design deletes halted VMs, KubeVirt none.
		if scaleKind == "proactive" || (scaleKind == "opportunistic" && alive[n].stopped && !kubevirt) {
			candidates = append(candidates, n)
		}
	}
	deleted := map[string]bool{}
	if excess := len(alive) - replicas; excess > 0 {
		policy, _ := scaleIn["selectionPolicy"].(map[string]any)
		for _, n := range order(selectable(candidates, policy), policy) {
			if len(plan.Delete) == excess {
				break
			}
			plan.Delete = append(plan.Delete, PoolDelete{Name: n, PreserveState: preserve, Volumes: orEmpty(alive[n].dataVolumes)})
			deleted[n] = true
		}
	}

	// Autohealing.
	records := map[string]PoolRecord{}
	if list, ok := get(pool, "status", "reprovisions").([]any); ok {
		for _, r := range list {
			m := r.(map[string]any)
			rec := PoolRecord{Name: str(m, "name"), Count: int64(num(m, "count")), LastTime: str(m, "lastTime")}
			records[rec.Name] = rec
		}
	}
	autohealing, healing := spec["autohealing"].(map[string]any)
	threshold := int64(3)
	minFailing := 5 * time.Minute
	if healing {
		if t, ok := autohealing["startupFailureThreshold"]; ok {
			threshold = int64(toFloat(t))
		}
		if d, ok := autohealing["minFailingToStartDuration"].(string); ok {
			minFailing, _ = time.ParseDuration(d)
		}
	}
	failing := func(v *poolVM) bool {
		if v.failures >= threshold {
			return true
		}
		return kubevirt && v.failingSince != nil && now.Sub(*v.failingSince) >= minFailing
	}
	reprovisioned := map[string]bool{}
	var waits []float64
	if healing {
		for _, n := range aliveNames {
			v := alive[n]
			if !failing(v) || deleted[n] {
				continue
			}
			rec, ok := records[n]
			if !ok {
				reprovisioned[n] = true
				continue
			}
			last, _ := time.Parse(time.RFC3339, rec.LastTime)
			backoff := min(s.InitialBackoffSeconds*(int64(1)<<min(rec.Count-1, 30)), s.MaxBackoffSeconds)
			due := last.UnixNano() + backoff*int64(time.Second)
			if now.UnixNano() >= due {
				reprovisioned[n] = true
			} else {
				waits = append(waits, math.Ceil(float64(due-now.UnixNano())/float64(time.Second)))
			}
		}
	}
	for n := range reprovisioned {
		plan.Reprovision = append(plan.Reprovision, n)
	}
	slices.Sort(plan.Reprovision)
	if healing {
		for n, rec := range records {
			if !reprovisioned[n] && !(alive[n] != nil && alive[n].ready) {
				plan.Records = append(plan.Records, rec)
			}
		}
		for _, n := range plan.Reprovision {
			plan.Records = append(plan.Records, PoolRecord{Name: n, Count: records[n].Count + 1, LastTime: now.UTC().Format(time.RFC3339)})
		}
	}
	slices.SortFunc(plan.Records, func(a, b PoolRecord) int { return strings.Compare(a.Name, b.Name) })

	// Scale-out.
	byOrdinal := func(set map[string]bool) []string {
		var out []string
		for n := range set {
			out = append(out, n)
		}
		slices.SortFunc(out, func(a, b string) int {
			if oa, ob := ordinalOf(a), ordinalOf(b); oa != ob {
				return oa - ob
			}
			return strings.Compare(a, b)
		})
		return out
	}
	pending := map[string]bool{}
	for n := range records {
		if ordinalOf(n) >= 0 && !held[n] {
			pending[n] = true
		}
	}
	keptFree := map[string]bool{}
	for n := range preservedOurs {
		if ordinalOf(n) >= 0 && !held[n] && !pending[n] {
			keptFree[n] = true
		}
	}
	reusable := append(byOrdinal(pending), byOrdinal(keptFree)...)
	counted := len(alive)
	if kubevirt {
		counted = owned // KubeVirt replaces a VM only once it is gone
	}
	deficit := replicas - counted
	createCount := 0
	if deficit > 0 {
		createCount = min(deficit, burst)
	}
	names := slices.Clone(reusable)
	inReusable := map[string]bool{}
	for _, n := range reusable {
		inReusable[n] = true
	}
	for n := first; len(names) < createCount; n++ {
		if candidate := fmt.Sprintf("%s%d", prefix, n); !held[candidate] && !inReusable[candidate] {
			names = append(names, candidate)
		}
	}
	plan.Create = names[:createCount]
	if len(plan.Create) == 0 {
		plan.Create = nil
	}
	for _, n := range plan.Create {
		plan.CreateVolumes[n], plan.CreateDataVolumes[n] = renderVolumeNames(spec, template, fmt.Sprintf("-%d", ordinalOf(n)))
	}

	// Updates.
	maxUnavailable := int64(0)
	raw := spec["maxUnavailable"]
	if raw == nil {
		raw = "25%"
		if kubevirt {
			raw = "100%"
		}
	}
	switch mu := raw.(type) {
	case string:
		pct, _ := strconv.Atoi(strings.TrimSuffix(mu, "%"))
		maxUnavailable = max(s.MaxUnavailableFloor, int64(replicas*pct/100))
	default:
		maxUnavailable = int64(toFloat(mu))
		if kubevirt {
			maxUnavailable = max(s.MaxUnavailableFloor, maxUnavailable)
		}
	}
	removed := func(n string) bool { return deleted[n] || reprovisioned[n] }
	// A restart disrupts a running VM KubeVirt reports ready; one reported not ready is free.
	disrupts := func(v *poolVM) bool { return v.restartable && v.active && v.reportedReady }
	updateKind, update := kind("updateStrategy")
	updatePolicy, _ := update["selectionPolicy"].(map[string]any)
	// Outdated VMs updates may take, and those whose update disrupts nothing: halted, not
	// restarted by it, or (KubeVirt, which updates every outdated VM at once and restarts its
	// VMI later) any.
	var outdated []string
	free := map[string]bool{}
	var freeNames []string
	for _, n := range selectable(aliveNames, updatePolicy) {
		v := alive[n]
		if removed(n) || v.current || !v.hasOrdinal {
			continue
		}
		outdated = append(outdated, n)
		switch {
		case kubevirt && updateKind != "unmanaged", updateKind == "opportunistic" && v.stopped, updateKind == "proactive" && !disrupts(v):
			free[n] = true
			freeNames = append(freeNames, n)
		}
	}
	freeUpdates := order(freeNames, updatePolicy)
	freeUpdates = freeUpdates[:min(burst, len(freeUpdates))]
	updatedNow := map[string]bool{}
	for _, n := range freeUpdates {
		updatedNow[n] = true
	}
	// The VMs restarts may take: with KubeVirt's semantics, those the update selectors match
	// once updated (a VM this plan updates gets the template's VMI labels).
	templateVMILabels := map[string]string{}
	if labels, ok := get(template, "spec", "template", "metadata", "labels").(map[string]any); ok {
		for k, val := range labels {
			templateVMILabels[k], _ = val.(string)
		}
	}
	restartScope := map[string]bool{}
	unavailable := 0
	for _, n := range aliveNames {
		labels := alive[n].templateLabels
		if updatedNow[n] {
			labels = templateVMILabels
		}
		if selects(updatePolicy, labels) {
			restartScope[n] = true
			if !alive[n].ready {
				unavailable++ // a VM whose VMI waits for its restart is available until then
			}
		}
	}
	// Pending restarts: VMs that carry the template once this plan is applied (with KubeVirt's
	// semantics, those it updates too) whose running VMI comes from another one (KubeVirt:
	// another VMI template).
	vmiWant := PoolVMIHash(template, s)
	pendingRestart := map[string]bool{}
	var pendingFree, pendingDisruptive, disruptive []string
	for _, n := range aliveNames {
		v := alive[n]
		willBeCurrent := v.current || (kubevirt && updatedNow[n])
		if removed(n) || !restartScope[n] || !willBeCurrent || !v.restartable || !v.active || v.vmiHash == vmiWant {
			continue
		}
		pendingRestart[n] = true
		if disrupts(v) {
			pendingDisruptive = append(pendingDisruptive, n)
		} else {
			pendingFree = append(pendingFree, n)
		}
	}
	outdatedSet := map[string]bool{}
	for _, n := range outdated {
		outdatedSet[n] = true
		if !free[n] && updateKind == "proactive" {
			disruptive = append(disruptive, n)
		}
	}
	// Every disruption takes the budget: pending restarts first, then updates of running VMs.
	budget := max(0, int(maxUnavailable)-unavailable)
	var chosen []string
	if updateKind == "proactive" {
		chosen = append(order(pendingDisruptive, updatePolicy), order(disruptive, updatePolicy)...)
		chosen = chosen[:min(budget, len(chosen))]
	}
	updated := slices.Clone(freeUpdates)
	for _, n := range chosen {
		if outdatedSet[n] && !free[n] {
			updated = append(updated, n)
		}
	}
	updated = updated[:min(burst, len(updated))]
	plan.Update = updated
	if updateKind == "proactive" {
		restart := map[string]bool{}
		if !kubevirt { // the design restarts a running VM with its update
			for _, n := range updated {
				if alive[n].active && alive[n].restartable {
					restart[n] = true
				}
			}
		}
		for _, n := range pendingFree {
			restart[n] = true
		}
		for _, n := range chosen {
			if pendingRestart[n] {
				restart[n] = true
			}
		}
		for n := range restart {
			plan.Restart = append(plan.Restart, n)
		}
		slices.Sort(plan.Restart)
	}

	// Requeue.
	if deficit > createCount {
		waits = append(waits, 0)
	}
	if len(updated) == burst && len(outdated) > burst {
		waits = append(waits, 0)
	}
	if len(waits) > 0 {
		w := slices.Min(waits)
		plan.RequeueAfterSeconds = &w
	}

	plan.Replicas = len(alive)
	for _, v := range alive {
		if v.ready {
			plan.ReadyReplicas++
		}
		if v.current {
			plan.UpdatedReplicas++
		}
	}
	return plan
}

func renderVolumeNames(spec, template map[string]any, postfix string) (volumes, dataVolumes []string) {
	dvNames := map[string]bool{}
	if dvts, ok := get(template, "spec", "dataVolumeTemplates").([]any); ok {
		for _, d := range dvts {
			n := str(d.(map[string]any), "metadata", "name")
			dvNames[n] = true
			dataVolumes = append(dataVolumes, n+postfix)
		}
	}
	secrets, _ := get(spec, "nameGeneration", "appendPostfixToSecretReferences").(bool)
	configMaps, _ := get(spec, "nameGeneration", "appendPostfixToConfigMapReferences").(bool)
	vols, _ := get(template, "spec", "template", "spec", "volumes").([]any)
	for _, raw := range vols {
		v := raw.(map[string]any)
		ref := func(path ...string) {
			n, ok := get(v, path...).(string)
			if !ok {
				return
			}
			volumes = append(volumes, n+postfix)
		}
		keep := func(path ...string) {
			if n, ok := get(v, path...).(string); ok {
				volumes = append(volumes, n)
			}
		}
		for _, path := range [][]string{{"dataVolume", "name"}, {"persistentVolumeClaim", "claimName"}} {
			if n, ok := get(v, path...).(string); ok {
				if dvNames[n] {
					ref(path...)
				} else {
					keep(path...)
				}
			}
		}
		for _, path := range [][]string{{"secret", "secretName"}, {"cloudInitNoCloud", "secretRef", "name"}, {"cloudInitNoCloud", "networkDataSecretRef", "name"},
			{"cloudInitConfigDrive", "secretRef", "name"}, {"cloudInitConfigDrive", "networkDataSecretRef", "name"}, {"sysprep", "secret", "name"}} {
			if secrets {
				ref(path...)
			} else {
				keep(path...)
			}
		}
		for _, path := range [][]string{{"configMap", "name"}, {"sysprep", "configMap", "name"}} {
			if configMaps {
				ref(path...)
			} else {
				keep(path...)
			}
		}
	}
	return volumes, dataVolumes
}

// PoolVolumeNames lists the names a rendered VM's volumes reference, in the order
// renderVolumeNames reads them, and its DataVolumeTemplate names.
func PoolVolumeNames(vm map[string]any) (volumes, dataVolumes []string) {
	spec, _ := vm["spec"].(map[string]any)
	return renderVolumeNames(map[string]any{}, map[string]any{"spec": spec}, "")
}

func randomRank(uid, name string) string {
	sum := sha256.Sum256([]byte(uid + "/" + name))
	return hex.EncodeToString(sum[:])
}

func ownedByPool(vm map[string]any, uid string) bool {
	refs, _ := get(vm, "metadata", "ownerReferences").([]any)
	for _, r := range refs {
		m, _ := r.(map[string]any)
		if c, _ := m["controller"].(bool); c && m["kind"] == "VirtualMachinePool" && m["uid"] == uid {
			return true
		}
	}
	return false
}

func vmiReady(vmi map[string]any) bool {
	conditions, _ := get(vmi, "status", "conditions").([]any)
	for _, c := range conditions {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// labelSelectorMatches is a metav1.LabelSelector's meaning, on the selector as stored.
func labelSelectorMatches(sel map[string]any, labels map[string]string) bool {
	if ml, ok := sel["matchLabels"].(map[string]any); ok {
		for k, v := range ml {
			if got, ok := labels[k]; !ok || got != v {
				return false
			}
		}
	}
	exprs, _ := sel["matchExpressions"].([]any)
	for _, raw := range exprs {
		e, _ := raw.(map[string]any)
		key, _ := e["key"].(string)
		got, present := labels[key]
		in := false
		values, _ := e["values"].([]any)
		for _, v := range values {
			if present && v == got {
				in = true
			}
		}
		switch e["operator"] {
		case "In":
			if !in {
				return false
			}
		case "NotIn":
			if in {
				return false
			}
		case "Exists":
			if !present {
				return false
			}
		case "DoesNotExist":
			if present {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func get(obj map[string]any, path ...string) any {
	if obj == nil {
		return nil
	}
	v, _, _ := unstructured.NestedFieldNoCopy(obj, path...)
	return v
}

func has(obj map[string]any, path ...string) bool { return get(obj, path...) != nil }

func str(obj map[string]any, path ...string) string {
	s, _ := get(obj, path...).(string)
	return s
}

func num(obj map[string]any, path ...string) float64 { return toFloat(get(obj, path...)) }

func toFloat(v any) float64 {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case int:
		return float64(n)
	case float64:
		return n
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return 0
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
