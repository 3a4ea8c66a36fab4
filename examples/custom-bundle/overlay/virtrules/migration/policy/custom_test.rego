# The admin's own tests for their change, run by `make custom-bundle` (opa test) next to the
# shipped ones, and by the engine when a bundle is served with its tests.
package virtrules.migration.policy_custom_test

import data.virtrules.migration.policy

test_precedence_is_kubevirt if {
	data.virtrules.migration.policy.settings.precedence == "kubevirt"
	count(policy.settings_errors) == 0
}

_selectors(vmi_labels, namespace_labels) := {"selectors": {
	"virtualMachineInstanceSelector": {"matchLabels": vmi_labels},
	"namespaceSelector": {"matchLabels": namespace_labels},
}}

# Design 000's VMI and its two best policies (examples/migration-policy/).
_design_000 := {
	"vmi": {"metadata": {
		"name": "fedora-gpu", "namespace": "hpc",
		"labels": {"size": "small", "os": "fedora", "gpu": "nvidia"},
	}},
	"namespace": {"metadata": {"name": "hpc", "labels": {"priority": "high", "bandwidth": "medium", "hpc-workload": "true"}}},
	"policies": [
		{
			"metadata": {"name": "tuned-bandwidth"},
			"spec": _selectors({"size": "small", "gpu": "nvidia"}, {"priority": "high", "bandwidth": "medium"}),
		},
		{
			"metadata": {"name": "hpc-large"},
			"spec": _selectors({"size": "small", "gpu": "nvidia"}, {"priority": "high", "hpc-workload": "true"}),
		},
	],
}

# Both match 4 labels, 2 of them the VMI's: KubeVirt's order falls back to the name, where
# the shipped default order would pick tuned-bandwidth by its sorted label keys.
test_design_000_tie_goes_to_the_first_name if {
	policy.decision.policy == "hpc-large" with input as _design_000
}
