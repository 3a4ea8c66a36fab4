// Package reference holds plain Go implementations of the virt-rules decisions, written from
// their specifications rather than from the Rego. Tests check the engine against them and
// benchmarks measure the engine against them; nothing serves decisions from this package.
package reference

import (
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// NamespaceNameLabel is the label the API server gives every Namespace, set to its name.
const NamespaceNameLabel = "kubernetes.io/metadata.name"

// Mode is a precedence order between matching MigrationPolicies.
type Mode string

const (
	// ModeDefault is design 000: most matching labels, then the smaller sorted list of
	// matching label keys, then more matching VMI labels, then the smaller name.
	ModeDefault Mode = "default"
	// ModeKubeVirt is what upstream KubeVirt does: most matching labels, then more matching
	// VMI labels, then the smaller name. A required value "" requires the empty value. A VMI
	// without labels matches every policy with selectors, with 0 labels (KubeVirt v1.8's
	// matchPolicy reads neither selector of such a VMI).
	ModeKubeVirt Mode = "kubevirt"
)

// Settings are the MigrationPolicy decision's bundle settings
// (data.virtrules.migration.policy.settings).
type Settings struct {
	Precedence Mode                                `json:"precedence"`
	Defaults   kubevirtv1.VMIMConfigurationOptions `json:"defaults"`
	// PolicyFields are the MigrationConfiguration fields a policy may set.
	PolicyFields []string `json:"policyFields"`
}

// ParseSettings reads the settings from the decision package's data.json.
func ParseSettings(dataJSON []byte) (Settings, error) {
	var data struct {
		Settings Settings `json:"settings"`
	}
	if err := json.Unmarshal(dataJSON, &data); err != nil {
		return Settings{}, fmt.Errorf("parse migration policy settings: %w", err)
	}
	return data.Settings, nil
}

// Policy is a MigrationPolicy reduced to what the decision reads. A requirement value of ""
// requires the label key with any value in ModeDefault, the empty value in ModeKubeVirt.
type Policy struct {
	Name      string
	VMI       map[string]string
	Namespace map[string]string
	// NoSelectors is set for a policy without spec.selectors: it matches no VMI.
	NoSelectors bool
	// Overrides holds the configuration fields the policy sets (only settings.PolicyFields).
	Overrides kubevirtv1.VMIMConfigurationOptions

	sortedKeys []string // cached SortedKeys, filled by NewPolicy
}

// NewPolicy builds a Policy with its precedence keys computed once.
func NewPolicy(name string, vmi, namespace map[string]string, overrides kubevirtv1.VMIMConfigurationOptions) Policy {
	p := Policy{Name: name, VMI: vmi, Namespace: namespace, Overrides: overrides}
	p.sortedKeys = p.SortedKeys()
	return p
}

// Requirements is the number of labels the policy requires, VMI and namespace together.
func (p *Policy) Requirements() int { return len(p.VMI) + len(p.Namespace) }

// SortedKeys is the sorted list of the policy's required label keys, VMI and namespace
// together; a key required of both appears twice.
func (p *Policy) SortedKeys() []string {
	if len(p.sortedKeys) == p.Requirements() {
		return p.sortedKeys
	}
	keys := make([]string, 0, p.Requirements())
	for k := range p.VMI {
		keys = append(keys, k)
	}
	for k := range p.Namespace {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// VMI is what the decision reads of a VirtualMachineInstance and its Namespace.
type VMI struct {
	Namespace string
	Labels    map[string]string
	// NamespaceLabels are the labels of the VMI's Namespace; nil when it is unknown.
	NamespaceLabels map[string]string
}

// namespaceLabel looks a label up on the VMI's Namespace, which always carries
// NamespaceNameLabel unless it is set explicitly.
func (v VMI) namespaceLabel(key string) (string, bool) {
	if value, ok := v.NamespaceLabels[key]; ok {
		return value, true
	}
	if key == NamespaceNameLabel {
		return v.Namespace, true
	}
	return "", false
}

// SelectorsIgnored tells whether mode reads no selector for the VMI: KubeVirt's for a VMI
// without labels.
func (v VMI) SelectorsIgnored(mode Mode) bool {
	return mode == ModeKubeVirt && len(v.Labels) == 0
}

// Matches tells whether the policy has selectors and the VMI and its Namespace carry every
// label the policy requires, as mode reads a required value; in ModeKubeVirt, every policy
// with selectors matches a VMI without labels.
func (p *Policy) Matches(vmi VMI, mode Mode) bool {
	if p.NoSelectors {
		return false
	}
	if vmi.SelectorsIgnored(mode) {
		return true
	}
	for key, want := range p.VMI {
		got, ok := vmi.Labels[key]
		if !satisfied(want, got, ok, mode) {
			return false
		}
	}
	for key, want := range p.Namespace {
		got, ok := vmi.namespaceLabel(key)
		if !satisfied(want, got, ok, mode) {
			return false
		}
	}
	return true
}

// satisfied: "" is any value in design 000 (ModeDefault); KubeVirt compares values as they are.
func satisfied(want, got string, present bool, mode Mode) bool {
	return present && ((want == "" && mode == ModeDefault) || got == want)
}

// Outranks tells whether policy a takes precedence over policy b, both matching, in mode.
func Outranks(a, b *Policy, mode Mode) bool {
	if a.Requirements() != b.Requirements() {
		return a.Requirements() > b.Requirements()
	}
	if mode == ModeDefault {
		if c := slices.Compare(a.SortedKeys(), b.SortedKeys()); c != 0 {
			return c < 0
		}
	}
	if len(a.VMI) != len(b.VMI) {
		return len(a.VMI) > len(b.VMI)
	}
	return a.Name < b.Name
}

// Decision is the policy a VMI obeys and its effective migration configuration.
type Decision struct {
	// Policy is the winning policy's name, "" when none matches.
	Policy string
	// MatchingLabels is the winner's number of requirements, 0 when none matches or the mode
	// reads no selector of the VMI.
	MatchingLabels int
	// Configuration is the defaults overlaid by the cluster's configuration, then by the
	// winner's overrides.
	Configuration kubevirtv1.VMIMConfigurationOptions
}

// outranksFor is Outranks for vmi: where mode reads no selector of vmi, every matching
// policy has 0 labels and the smaller name wins.
func outranksFor(vmi VMI, a, b *Policy, mode Mode) bool {
	if vmi.SelectorsIgnored(mode) {
		return a.Name < b.Name
	}
	return Outranks(a, b, mode)
}

// Decide picks the policy vmi obeys by looking at every policy once, and layers the
// configuration: settings.Defaults, then cluster (the KubeVirt CR's
// spec.configuration.migrations), then the winner's overrides.
func Decide(policies []Policy, vmi VMI, settings Settings, cluster kubevirtv1.VMIMConfigurationOptions) Decision {
	var best *Policy
	for i := range policies {
		p := &policies[i]
		if p.Matches(vmi, settings.Precedence) && (best == nil || outranksFor(vmi, p, best, settings.Precedence)) {
			best = p
		}
	}
	var d Decision
	var overrides kubevirtv1.VMIMConfigurationOptions
	if best != nil {
		d.Policy, d.MatchingLabels, overrides = best.Name, best.Requirements(), best.Overrides
		if vmi.SelectorsIgnored(settings.Precedence) {
			d.MatchingLabels = 0
		}
	}
	d.Configuration = Layer(settings.Defaults, cluster, overrides)
	return d
}

// Ranked returns the policies that match vmi, highest precedence first.
func Ranked(policies []Policy, vmi VMI, mode Mode) []*Policy {
	var matching []*Policy
	for i := range policies {
		if policies[i].Matches(vmi, mode) {
			matching = append(matching, &policies[i])
		}
	}
	slices.SortFunc(matching, func(a, b *Policy) int {
		switch {
		case outranksFor(vmi, a, b, mode):
			return -1
		case outranksFor(vmi, b, a, mode):
			return 1
		}
		return 0
	})
	return matching
}

// Layer overlays the set fields of each layer on the previous ones, in order. Workload
// disruption is decided by the last layer that sets allowWorkloadDisruption or
// allowPostCopy: its allowWorkloadDisruption if set, else its allowPostCopy. The experimental
// options are overlaid field by field, as KubeVirt merges a policy's.
func Layer(layers ...kubevirtv1.VMIMConfigurationOptions) kubevirtv1.VMIMConfigurationOptions {
	var out kubevirtv1.VMIMConfigurationOptions
	var disruption *bool
	for i := range layers {
		overlay(&out, &layers[i])
		switch {
		case layers[i].AllowWorkloadDisruption != nil:
			disruption = layers[i].AllowWorkloadDisruption
		case layers[i].AllowPostCopy != nil:
			disruption = layers[i].AllowPostCopy
		}
	}
	out.AllowWorkloadDisruption = disruption
	return *out.DeepCopy()
}

// overlay copies every field src sets onto dst.
func overlay(dst, src *kubevirtv1.VMIMConfigurationOptions) {
	setIf(&dst.NodeDrainTaintKey, src.NodeDrainTaintKey)
	setIf(&dst.ParallelOutboundMigrationsPerNode, src.ParallelOutboundMigrationsPerNode)
	setIf(&dst.ParallelMigrationsPerCluster, src.ParallelMigrationsPerCluster)
	setIf(&dst.AllowAutoConverge, src.AllowAutoConverge)
	setIf(&dst.BandwidthPerMigration, src.BandwidthPerMigration)
	setIf(&dst.CompletionTimeoutPerGiB, src.CompletionTimeoutPerGiB)
	setIf(&dst.MaxDowntimeMs, src.MaxDowntimeMs)
	setIf(&dst.ProgressTimeout, src.ProgressTimeout)
	setIf(&dst.UtilityVolumesTimeout, src.UtilityVolumesTimeout)
	setIf(&dst.UnsafeMigrationOverride, src.UnsafeMigrationOverride)
	setIf(&dst.AllowPostCopy, src.AllowPostCopy)
	setIf(&dst.AllowWorkloadDisruption, src.AllowWorkloadDisruption)
	setIf(&dst.DisableTLS, src.DisableTLS)
	setIf(&dst.Network, src.Network)
	setIf(&dst.MatchSELinuxLevelOnMigration, src.MatchSELinuxLevelOnMigration)
	if e := src.ExperimentalMigrationOptions; e != nil {
		if dst.ExperimentalMigrationOptions == nil {
			dst.ExperimentalMigrationOptions = &kubevirtv1.ExperimentalMigrationOptions{}
		} else {
			dst.ExperimentalMigrationOptions = dst.ExperimentalMigrationOptions.DeepCopy()
		}
		overlayExperimental(dst.ExperimentalMigrationOptions, e)
	}
}

func overlayExperimental(dst, src *kubevirtv1.ExperimentalMigrationOptions) {
	setIf(&dst.Compression, src.Compression)
	if s := src.StallDetector; s != nil {
		if dst.StallDetector == nil {
			dst.StallDetector = &kubevirtv1.StallDetectorOptions{}
		}
		d := dst.StallDetector
		setIf(&d.StallMargin, s.StallMargin)
		setIf(&d.EwmaAlpha, s.EwmaAlpha)
		setIf(&d.StallProgressTimeout, s.StallProgressTimeout)
		setIf(&d.SwitchoverTimeout, s.SwitchoverTimeout)
		setIf(&d.PrecopyPossibleFactor, s.PrecopyPossibleFactor)
		setIf(&d.PatienceWindowDecayFactor, s.PatienceWindowDecayFactor)
		setIf(&d.SearchLocalMinima, s.SearchLocalMinima)
		setIf(&d.CompletionTimeoutFactor, s.CompletionTimeoutFactor)
	}
}

func setIf[T any](dst **T, src *T) {
	if src != nil {
		*dst = src
	}
}

// PoliciesFromUnstructured converts MigrationPolicies as stored. Overrides keep only the
// fields in policyFields. A selector must be a map of label key to string value or
// {matchLabels: {...}}; a policy with any other selector is an error. A policy without
// spec.selectors (absent or null) gets NoSelectors.
func PoliciesFromUnstructured(objs []*unstructured.Unstructured, policyFields []string) ([]Policy, error) {
	policies := make([]Policy, 0, len(objs))
	for _, obj := range objs {
		p, err := policyFromUnstructured(obj, policyFields)
		if err != nil {
			return nil, fmt.Errorf("convert MigrationPolicy %s: %w", obj.GetName(), err)
		}
		policies = append(policies, p)
	}
	return policies, nil
}

func policyFromUnstructured(obj *unstructured.Unstructured, policyFields []string) (Policy, error) {
	spec, _, _ := unstructured.NestedMap(obj.Object, "spec")
	selectors, _ := spec["selectors"].(map[string]any)
	noSelectors := spec["selectors"] == nil
	vmi, err := selectorRequirements(selectors["virtualMachineInstanceSelector"])
	if err != nil {
		return Policy{}, fmt.Errorf("virtualMachineInstanceSelector: %w", err)
	}
	namespace, err := selectorRequirements(selectors["namespaceSelector"])
	if err != nil {
		return Policy{}, fmt.Errorf("namespaceSelector: %w", err)
	}
	set := map[string]any{}
	for _, field := range policyFields {
		if value, ok := spec[field]; ok && value != nil {
			set[field] = value
		}
	}
	var overrides kubevirtv1.VMIMConfigurationOptions
	if err := remarshal(set, &overrides); err != nil {
		return Policy{}, fmt.Errorf("configuration: %w", err)
	}
	p := NewPolicy(obj.GetName(), vmi, namespace, overrides)
	p.NoSelectors = noSelectors
	return p, nil
}

// selectorRequirements reads a selector: absent, a plain map or {matchLabels: {...}}.
func selectorRequirements(selector any) (map[string]string, error) {
	if selector == nil {
		return map[string]string{}, nil
	}
	m, ok := selector.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want a map, got %T", selector)
	}
	if _, ok := m["matchExpressions"]; ok {
		return nil, fmt.Errorf("matchExpressions is not supported")
	}
	if inner, ok := m["matchLabels"]; ok {
		if len(m) != 1 {
			return nil, fmt.Errorf("matchLabels beside other keys")
		}
		if m, ok = inner.(map[string]any); !ok {
			return nil, fmt.Errorf("matchLabels: want a map, got %T", inner)
		}
	}
	reqs := make(map[string]string, len(m))
	for key, value := range m {
		s, ok := value.(string)
		if !ok {
			return nil, fmt.Errorf("label %s: want a string, got %T", key, value)
		}
		reqs[key] = s
	}
	return reqs, nil
}

// ClusterConfiguration reads spec.configuration.migrations of the KubeVirt CR; nil gives
// the empty configuration. It is read as the options KubeVirt resolves per migration, so
// that a CR given offline with experimental options keeps them (a cluster prunes them).
func ClusterConfiguration(kubevirt *unstructured.Unstructured) (kubevirtv1.VMIMConfigurationOptions, error) {
	var cfg kubevirtv1.VMIMConfigurationOptions
	if kubevirt == nil {
		return cfg, nil
	}
	migrations, _, err := unstructured.NestedFieldNoCopy(kubevirt.Object, "spec", "configuration", "migrations")
	if err != nil {
		return cfg, fmt.Errorf("read KubeVirt %s: %w", kubevirt.GetName(), err)
	}
	if migrations == nil {
		return cfg, nil
	}
	if err := remarshal(migrations, &cfg); err != nil {
		return cfg, fmt.Errorf("read KubeVirt %s migrations: %w", kubevirt.GetName(), err)
	}
	return cfg, nil
}

func remarshal(in, out any) error {
	raw, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}
