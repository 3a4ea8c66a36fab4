package engine

// The entrypoints every bundle must provide. One Rego package per decision, named after it;
// the Go method serving it carries the same name (MigrationPolicy ... -> migration.policy).
const (
	entryMigrationPolicy            = "migration.policy"
	entryMigrationPolicyExplanation = "migration.policy.explanation"
	entryMigrationPolicyIndex       = "migration.policy.index"
	entryMigrationPolicyValidation  = "migration.policy.validation"
	// entryMigrationPolicySelectorKeys is optional: without it every existing policy is passed
	// to the validation (migrationpolicyvalidation.go).
	entryMigrationPolicySelectorKeys = "migration.policy.validation.selector_keys"

	entryMigrationTarget            = "migration.target"
	entryMigrationTargetExplanation = "migration.target.explanation"
	entryMigrationTermValidation    = "migration.target.term_errors"
	entryMigrationTargetPodAffinity = "migration.target.pod_node_affinity"

	// The drain preview's, optional so that a bundle built before it still serves the other
	// decisions: without them Drain is ErrMissingDecision.
	entryMigrationDrainEvacuees  = "migration.drain.evacuees"
	entryMigrationDrainPlacement = "migration.drain.placement"

	entryNodeMigratabilitySignatures = "node.migratability.signatures"
	entryNodeMigratabilityPrefixes   = "node.migratability.signature_label_prefixes"
	entryNodeMigratabilityLevels     = "node.migratability.levels"
	// entryNodeMigratabilityReach is optional: without it every change of the nodes has
	// `levels` compare the signatures again (nodes.go).
	entryNodeMigratabilityReach = "node.migratability.reach"
	entrySchedulingAffinity     = "node.migratability.scheduling_affinity"

	// The CPU baseline's, optional so that a bundle built before it still serves the other
	// decisions: without them CPUBaseline is ErrMissingDecision.
	entryNodeBaseline         = "node.baseline.decision"
	entryNodeBaselinePrefixes = "node.baseline.label_prefixes"

	entryPoolPlan = "pool.plan"

	entryVMDefaultsPlan = "vm.defaults.plan"
	entryVMDefaults     = "vm.defaults.defaults"
	entryVMShape        = "vm.defaults.shape"
)

// entrypoints maps each entrypoint name to its query.
var entrypoints = map[string]string{
	entryMigrationPolicy:            "data.virtrules.migration.policy.decision",
	entryMigrationPolicyExplanation: "data.virtrules.migration.policy.explanation",
	entryMigrationPolicyIndex:       "data.virtrules.migration.policy.index",
	entryMigrationPolicyValidation:  "data.virtrules.migration.policy.validation.decision",

	entryMigrationTarget:            "data.virtrules.migration.target.decision",
	entryMigrationTargetExplanation: "data.virtrules.migration.target.explanation",
	entryMigrationTermValidation:    "data.virtrules.migration.target.term_errors",
	entryMigrationTargetPodAffinity: "data.virtrules.migration.target.pod_node_affinity",

	entryNodeMigratabilitySignatures: "data.virtrules.node.migratability.signatures",
	entryNodeMigratabilityPrefixes:   "data.virtrules.node.migratability.signature_label_prefixes",
	entryNodeMigratabilityLevels:     "data.virtrules.node.migratability.levels",
	entrySchedulingAffinity:          "data.virtrules.node.migratability.scheduling_affinity",

	entryPoolPlan: "data.virtrules.pool.plan",

	entryVMDefaultsPlan: "data.virtrules.vm.defaults.plan",
	entryVMDefaults:     "data.virtrules.vm.defaults.defaults",
}

// optionalEntrypoints are entrypoints a bundle may leave out: the Go side then does without
// what they offer (vm.defaults.shape: the defaulter's shape cache; node.migratability.reach:
// levels without comparing signatures again after a node joins or leaves; migration.drain: no
// drain preview, an ErrMissingDecision; node.baseline: no CPU baseline, the same). One a bundle has is
// prepared like every other.
var optionalEntrypoints = map[string]string{
	entryVMShape:                     "data.virtrules.vm.defaults.shape",
	entryMigrationPolicySelectorKeys: "data.virtrules.migration.policy.validation.selector_keys",
	entryNodeMigratabilityReach:      "data.virtrules.node.migratability.reach",
	entryMigrationDrainEvacuees:      "data.virtrules.migration.drain.evacuees",
	entryMigrationDrainPlacement:     "data.virtrules.migration.drain.placement",
	entryNodeBaseline:                "data.virtrules.node.baseline.decision",
	entryNodeBaselinePrefixes:        "data.virtrules.node.baseline.label_prefixes",
}

// settingsChecks are the rules that report invalid bundle settings (bundle data) of a
// decision package. A bundle for which any of them is non-empty is refused.
var settingsChecks = []string{
	"data.virtrules.migration.policy.settings_errors",
	"data.virtrules.pool.settings_errors",
}
