package reference

import (
	"encoding/binary"
	"iter"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Host-model migratability (design 002). A node A can take host-model VMs to a node B when
// B != A, B is schedulable, B carries cpu-model-migration.node.kubevirt.io/<A's host model>
// and, for every host-model-required-features.node.kubevirt.io/<f> of A,
// cpu-feature.node.kubevirt.io/<f>. The level of a schedulable node A with a host model is
// floor(100 * |such B| / |schedulable nodes other than A|), 0 when A is the only one.
//
// Edge rules, as the Rego decision (virtrules.node.migratability) has them:
//   - a node is unschedulable when spec.unschedulable is the boolean true or its label
//     kubevirt.io/schedulable is "false";
//   - only CPU labels set to "true" count; any other value is as if the label were absent;
//   - a CPU label key is exactly <prefix>/<name> with a non-empty name and no further "/";
//   - a node with several host-model-cpu labels set to "true" has no host model, so no level
//     (it may still be a destination).
//
// MigratabilityPairwise is the design's O(n²·m) definition, the correctness oracle;
// MigratabilityGrouped (and MigratabilityView, its incremental form) groups nodes by CPU
// signature first, the fast reference the engine's benchmarks compare against.

// The node labels host-model migratability reads.
const (
	HostModelCPULabelPrefix         = "host-model-cpu.node.kubevirt.io/"
	HostModelRequiredFeaturesPrefix = "host-model-required-features.node.kubevirt.io/"
	CPUModelMigrationLabelPrefix    = "cpu-model-migration.node.kubevirt.io/"
	CPUFeatureLabelPrefix           = "cpu-feature.node.kubevirt.io/"
	SchedulableLabel                = "kubevirt.io/schedulable"
)

// Node is a core/v1 Node reduced to what host-model migratability reads.
type Node struct {
	Name string
	// Unschedulable is spec.unschedulable (cordoned).
	Unschedulable bool
	// Labels are read, never written.
	Labels map[string]string
}

// NodeFromTyped reduces a typed Node; the labels are shared, not copied.
func NodeFromTyped(n *corev1.Node) Node {
	return Node{Name: n.Name, Unschedulable: n.Spec.Unschedulable, Labels: n.Labels}
}

// NodeFromUnstructured reduces a Node as stored. As in the Rego, spec.unschedulable counts
// only when it is the boolean true, and a label whose value is not a string is ignored (no
// such value equals "true" or "false").
func NodeFromUnstructured(u *unstructured.Unstructured) Node {
	return Node{Name: u.GetName(), Unschedulable: unschedulable(u), Labels: maps.Collect(storedLabels(u))}
}

func unschedulable(u *unstructured.Unstructured) bool {
	cordoned, _, _ := unstructured.NestedBool(u.Object, "spec", "unschedulable")
	return cordoned
}

// storedLabels yields the labels of a Node as stored whose values are strings, in place.
func storedLabels(u *unstructured.Unstructured) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		metadata, _ := u.Object["metadata"].(map[string]any)
		labels, _ := metadata["labels"].(map[string]any)
		for k, v := range labels {
			if s, ok := v.(string); ok && !yield(k, s) {
				return
			}
		}
	}
}

// NodesFromUnstructured reduces every node.
func NodesFromUnstructured(objs []*unstructured.Unstructured) []Node {
	nodes := make([]Node, len(objs))
	for i, o := range objs {
		nodes[i] = NodeFromUnstructured(o)
	}
	return nodes
}

// Schedulable tells whether VMs may be scheduled to the node.
func (n Node) Schedulable() bool {
	return !n.Unschedulable && n.Labels[SchedulableLabel] != "false"
}

// LabelNames lists, sorted, the names of the node's labels <prefix><name> set to "true"
// (prefix ends in "/"; name is non-empty and holds no "/").
func (n Node) LabelNames(prefix string) []string {
	var out []string
	for key, value := range n.Labels {
		if value != "true" || !strings.HasPrefix(key, prefix) {
			continue
		}
		if name := key[len(prefix):]; validLabelName(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func validLabelName(name string) bool { return name != "" && !strings.Contains(name, "/") }

// HostModel is the model of the node's host-model-cpu label; ok is false when it has none
// or several.
func (n Node) HostModel() (model string, ok bool) {
	models := n.LabelNames(HostModelCPULabelPrefix)
	if len(models) != 1 {
		return "", false
	}
	return models[0], true
}

// CanMigrate tells whether a host-model VM first started on a can run on b, by their CPU
// labels alone (whether b is schedulable, or is a, is the caller's business).
func CanMigrate(a, b Node) bool {
	model, ok := a.HostModel()
	if !ok || b.Labels[CPUModelMigrationLabelPrefix+model] != "true" {
		return false
	}
	for _, feature := range a.LabelNames(HostModelRequiredFeaturesPrefix) {
		if b.Labels[CPUFeatureLabelPrefix+feature] != "true" {
			return false
		}
	}
	return true
}

// level is floor(100 * reachable / others), 0 without others.
func level(reachable, others int) int {
	if others <= 0 {
		return 0
	}
	return 100 * reachable / others
}

// MigratabilityPairwise returns the level of every schedulable node with a host model (node
// name -> 0..100) by trying every pair of nodes: O(n²·m). Names must be distinct.
func MigratabilityPairwise(nodes []Node) map[string]int {
	levels := map[string]int{}
	for i, a := range nodes {
		if _, ok := a.HostModel(); !ok || !a.Schedulable() {
			continue
		}
		others, reachable := 0, 0
		for j, b := range nodes {
			if j == i || !b.Schedulable() {
				continue
			}
			others++
			if CanMigrate(a, b) {
				reachable++
			}
		}
		levels[a.Name] = level(reachable, others)
	}
	return levels
}

// Signature is everything about a node that migratability depends on. Nodes with equal
// signatures are interchangeable.
type Signature struct {
	Schedulable  bool
	HostModel    string
	HasHostModel bool
	// Sorted label names set to "true".
	RequiredFeatures, Models, Features []string
}

// SignatureOf reads a node's signature in one pass over its labels.
func SignatureOf(n Node) Signature { return signatureOf(n.Unschedulable, maps.All(n.Labels)) }

// SignatureOfUnstructured is SignatureOf(NodeFromUnstructured(u)), reading the labels in
// place.
func SignatureOfUnstructured(u *unstructured.Unstructured) Signature {
	return signatureOf(unschedulable(u), storedLabels(u))
}

func signatureOf(cordoned bool, labels iter.Seq2[string, string]) Signature {
	s := Signature{Schedulable: !cordoned}
	var hostModels []string
	for key, value := range labels {
		switch kind, name := classify(key); {
		case kind == schedulableLabel && value == "false":
			s.Schedulable = false
		case kind >= hostModelLabel && value == "true":
			s.add(kind, name, &hostModels)
		}
	}
	s.finish(hostModels)
	return s
}

// add records a CPU label set to "true"; host models are collected apart.
func (s *Signature) add(kind labelKind, name string, hostModels *[]string) {
	switch kind {
	case hostModelLabel:
		*hostModels = append(*hostModels, name)
	case requiredFeatureLabel:
		s.RequiredFeatures = append(s.RequiredFeatures, name)
	case modelLabel:
		s.Models = append(s.Models, name)
	case featureLabel:
		s.Features = append(s.Features, name)
	}
}

// finish settles the host model and sorts the lists.
func (s *Signature) finish(hostModels []string) {
	if len(hostModels) == 1 {
		s.HostModel, s.HasHostModel = hostModels[0], true
	}
	slices.Sort(s.RequiredFeatures)
	slices.Sort(s.Models)
	slices.Sort(s.Features)
}

// Key is a canonical text of the signature: equal keys, equal signatures.
func (s Signature) Key() string {
	var b strings.Builder
	if s.Schedulable {
		b.WriteString("s")
	} else {
		b.WriteString("u")
	}
	if s.HasHostModel {
		b.WriteString("\x00" + s.HostModel)
	}
	for _, list := range [][]string{s.RequiredFeatures, s.Models, s.Features} {
		b.WriteString("\x01")
		for _, name := range list {
			b.WriteString("\x00" + name)
		}
	}
	return b.String()
}

// sourceKey is what a group's VMs need of a destination: host model and required features.
func (s Signature) sourceKey() string {
	return s.HostModel + "\x01" + strings.Join(s.RequiredFeatures, "\x00")
}

// MigratabilityGrouped returns the same levels as MigratabilityPairwise, grouping nodes by
// signature so the comparisons number distinct sources times distinct signatures.
func MigratabilityGrouped(nodes []Node) map[string]int {
	v := NewMigratabilityView()
	for _, n := range nodes {
		v.Upsert(n)
	}
	return v.Levels()
}

// MigratabilityGroupedUnstructured is MigratabilityGrouped of Nodes as stored, reading their
// labels in place.
func MigratabilityGroupedUnstructured(objs []*unstructured.Unstructured) map[string]int {
	v := NewMigratabilityView()
	for _, u := range objs {
		v.UpsertUnstructured(u)
	}
	return v.Levels()
}

// MigratabilityView keeps the nodes' signature groups up to date one node at a time, the Go
// counterpart of the engine's Nodes: an update moves a count, Levels recomputes per group.
// It interns every label key it sees, so a node's group key is a bitset of its CPU labels
// set to "true", built without sorting; the group's Signature is made once per group.
// Not safe for concurrent use.
type MigratabilityView struct {
	nodes  map[string]string          // node name -> group key
	groups map[string]*signatureGroup // group key -> group
	labels map[string]labelClass      // every label key seen
	cpu    []cpuLabel                 // the CPU label keys seen, by bit
	bits   []uint64                   // scratch
}

type labelKind uint8

const (
	otherLabel labelKind = iota
	schedulableLabel
	hostModelLabel
	requiredFeatureLabel
	modelLabel
	featureLabel
)

type labelClass struct {
	kind labelKind
	bit  int // CPU labels only
}

type cpuLabel struct {
	kind labelKind
	name string
}

// classify tells what a label key is to a signature, and the name of a CPU label.
func classify(key string) (labelKind, string) {
	if key == SchedulableLabel {
		return schedulableLabel, ""
	}
	slash := strings.IndexByte(key, '/')
	if slash < 0 || !validLabelName(key[slash+1:]) {
		return otherLabel, ""
	}
	switch key[:slash+1] {
	case HostModelCPULabelPrefix:
		return hostModelLabel, key[slash+1:]
	case HostModelRequiredFeaturesPrefix:
		return requiredFeatureLabel, key[slash+1:]
	case CPUModelMigrationLabelPrefix:
		return modelLabel, key[slash+1:]
	case CPUFeatureLabelPrefix:
		return featureLabel, key[slash+1:]
	}
	return otherLabel, ""
}

type signatureGroup struct {
	sig      Signature
	count    int
	models   map[string]bool
	features map[string]bool
}

// NewMigratabilityView returns an empty view.
func NewMigratabilityView() *MigratabilityView {
	return &MigratabilityView{nodes: map[string]string{}, groups: map[string]*signatureGroup{}, labels: map[string]labelClass{}}
}

// Upsert adds a node or replaces the node of the same name.
func (v *MigratabilityView) Upsert(n Node) { v.upsert(n.Name, n.Unschedulable, maps.All(n.Labels)) }

// UpsertUnstructured is Upsert(NodeFromUnstructured(u)), reading the labels in place.
func (v *MigratabilityView) UpsertUnstructured(u *unstructured.Unstructured) {
	v.upsert(u.GetName(), unschedulable(u), storedLabels(u))
}

func (v *MigratabilityView) upsert(name string, cordoned bool, labels iter.Seq2[string, string]) {
	v.Delete(name)
	key := v.groupKey(cordoned, labels)
	g := v.groups[key]
	if g == nil {
		sig := v.signature(key)
		g = &signatureGroup{sig: sig, models: set(sig.Models), features: set(sig.Features)}
		v.groups[key] = g
	}
	g.count++
	v.nodes[name] = key
}

// groupKey is 's' or 'u' (schedulable or not), then the bitset of the CPU labels set to
// "true", without trailing zero words.
func (v *MigratabilityView) groupKey(cordoned bool, labels iter.Seq2[string, string]) string {
	bits := v.bits[:0]
	schedulable := !cordoned
	for key, value := range labels {
		c, ok := v.labels[key]
		if !ok {
			var name string
			c.kind, name = classify(key)
			if c.kind >= hostModelLabel {
				c.bit = len(v.cpu)
				v.cpu = append(v.cpu, cpuLabel{c.kind, name})
			}
			v.labels[key] = c
		}
		switch {
		case c.kind == schedulableLabel && value == "false":
			schedulable = false
		case c.kind >= hostModelLabel && value == "true":
			for len(bits) <= c.bit/64 {
				bits = append(bits, 0)
			}
			bits[c.bit/64] |= 1 << (c.bit % 64)
		}
	}
	for len(bits) > 0 && bits[len(bits)-1] == 0 {
		bits = bits[:len(bits)-1]
	}
	v.bits = bits
	key := make([]byte, 1, 1+8*len(bits))
	key[0] = 'u'
	if schedulable {
		key[0] = 's'
	}
	for _, w := range bits {
		key = binary.LittleEndian.AppendUint64(key, w)
	}
	return string(key)
}

// signature is the Signature a group key stands for.
func (v *MigratabilityView) signature(key string) Signature {
	s := Signature{Schedulable: key[0] == 's'}
	var hostModels []string
	for i := 1; i < len(key); i++ {
		for b := range 8 {
			if key[i]&(1<<b) != 0 {
				label := v.cpu[(i-1)*8+b]
				s.add(label.kind, label.name, &hostModels)
			}
		}
	}
	s.finish(hostModels)
	return s
}

// Delete removes the node named name, if present.
func (v *MigratabilityView) Delete(name string) {
	key, ok := v.nodes[name]
	if !ok {
		return
	}
	delete(v.nodes, name)
	g := v.groups[key]
	if g.count--; g.count == 0 {
		delete(v.groups, key)
	}
}

// Len is the number of nodes.
func (v *MigratabilityView) Len() int { return len(v.nodes) }

// GroupLevels is the level of every schedulable group with a host model, by group key.
func (v *MigratabilityView) GroupLevels() map[string]int {
	total := 0
	for _, g := range v.groups {
		if g.sig.Schedulable {
			total += g.count
		}
	}
	reach := map[string]int{} // source key -> schedulable destinations, sources included
	out := map[string]int{}
	for key, g := range v.groups {
		if !g.sig.Schedulable || !g.sig.HasHostModel {
			continue
		}
		source := g.sig.sourceKey()
		r, ok := reach[source]
		if !ok {
			for _, target := range v.groups {
				if target.sig.Schedulable && g.reaches(target) {
					r += target.count
				}
			}
			reach[source] = r
		}
		if g.reaches(g) {
			r-- // a node is no destination for itself
		}
		out[key] = level(r, total-1)
	}
	return out
}

// reaches: a host-model VM started on a node of g can run on a node of target.
func (g *signatureGroup) reaches(target *signatureGroup) bool {
	if !target.models[g.sig.HostModel] {
		return false
	}
	for _, f := range g.sig.RequiredFeatures {
		if !target.features[f] {
			return false
		}
	}
	return true
}

// Levels is the level of every schedulable node with a host model, by node name.
func (v *MigratabilityView) Levels() map[string]int {
	byGroup := v.GroupLevels()
	levels := make(map[string]int, len(v.nodes))
	for name, key := range v.nodes {
		if l, ok := byGroup[key]; ok {
			levels[name] = l
		}
	}
	return levels
}

func set(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}
