package eval

import "github.com/virt-rules/virt-rules/engine"

// MigrationPolicyResultOf is d, the MigrationPolicy decision for the VMI named by key
// (namespace/name), as eval reports it (without explanation).
func MigrationPolicyResultOf(key string, d *engine.MigrationPolicyDecision) MigrationPolicyResult {
	r := MigrationPolicyResult{VMI: key, MatchingLabels: d.MatchingLabels, Configuration: d.Configuration}
	if d.Policy != "" {
		policy := d.Policy
		r.Policy = &policy
	}
	return r
}

// MigrationTargetResultOf is d, the decision for the migration named by key (namespace/name)
// of the VMI named by vmi, as eval reports it (without explanation).
func MigrationTargetResultOf(key, vmi string, d *engine.MigrationTargetDecision) MigrationTargetResult {
	return MigrationTargetResult{
		Migration: key, VMI: vmi,
		CandidateNodes: d.CandidateNodes, TargetNodeAffinity: d.TargetNodeAffinity, Error: d.Error,
	}
}
