package engine

// The entrypoints every bundle must provide. One Rego package per decision, named after it;
// the Go method serving it carries the same name (MigrationPolicy ... -> migration.policy).
const (
	entryMigrationPolicy            = "migration.policy"
	entryMigrationPolicyExplanation = "migration.policy.explanation"
	entryMigrationPolicyIndex       = "migration.policy.index"
	entryMigrationPolicyValidation  = "migration.policy.validation"
)

// entrypoints maps each entrypoint name to its query.
var entrypoints = map[string]string{
	entryMigrationPolicy:            "data.virtrules.migration.policy.decision",
	entryMigrationPolicyExplanation: "data.virtrules.migration.policy.explanation",
	entryMigrationPolicyIndex:       "data.virtrules.migration.policy.index",
	entryMigrationPolicyValidation:  "data.virtrules.migration.policy.validation.decision",
}

// settingsChecks are the rules that report invalid bundle settings (bundle data) of a
// decision package. A bundle for which any of them is non-empty is refused.
var settingsChecks = []string{
	"data.virtrules.migration.policy.settings_errors",
}
