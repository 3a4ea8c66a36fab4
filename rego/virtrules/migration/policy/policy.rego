# METADATA
# title: MigrationPolicy precedence
# description: |
#   Which MigrationPolicy (migrations.kubevirt.io/v1alpha1) a VirtualMachineInstance obeys, and
#   the migration configuration that results (design proposal 000).
#
#   Input of `decision` and `explanation`:
#     vmi:       the VirtualMachineInstance as stored (metadata.namespace, metadata.labels)
#     namespace: its Namespace as stored (metadata.labels); absent when unknown
#     kubevirt:  the KubeVirt CR as stored (spec.configuration.migrations); absent when unknown
#     policies:  every MigrationPolicy as stored, or instead
#     index:     the value of `index` for those policies. The engine evaluates `index` once per
#                policy set and passes it back, so one decision touches only the policies that
#                share a label with the VMI instead of every policy.
#
#   Input of `index`: policies.
#
#   Settings (bundle data, data.virtrules.migration.policy.settings):
#     precedence:   "default" (design 000) or "kubevirt" (what upstream KubeVirt does)
#     defaults:     KubeVirt's documented MigrationConfiguration defaults
#     policyFields: the MigrationConfiguration fields a policy may set
package virtrules.migration.policy

_settings := settings if {
	settings := data.virtrules.migration.policy.settings
	is_object(settings)
} else := {}

_scopes := ["virtualMachineInstance", "namespace"]

_precedences := {"default", "kubevirt"}

# Settings are read below with object.get: OPA evaluates an undefined argument of a negated call
# (`not is_object(_settings.defaults)`) outside the negation, so such a check never fires.

# METADATA
# description: Problems with the bundle's settings; the engine refuses a bundle that has any.
settings_errors contains msg if {
	precedence := object.get(_settings, "precedence", null)
	not precedence in _precedences
	msg := sprintf("settings.precedence: %v is not one of %v", [precedence, _precedences])
}

settings_errors contains msg if {
	not is_object(object.get(_settings, "defaults", null))
	msg := "settings.defaults: must be an object of MigrationConfiguration fields"
}

settings_errors contains msg if {
	not is_boolean(object.get(_settings, ["defaults", "allowPostCopy"], null))
	msg := "settings.defaults.allowPostCopy: must be a boolean (allowWorkloadDisruption follows it)"
}

# METADATA
# description: |
#   The label requirements of a policy selector in one shape: label key to value, where ""
#   requires the key with any value. Accepts the design's `{matchLabels: {...}}` and KubeVirt's
#   plain map; undefined for any other shape.
selector_requirements(selector) := {} if selector == null

selector_requirements(selector) := selector.matchLabels if {
	is_object(selector)
	object.keys(selector) == {"matchLabels"}
	_string_map(selector.matchLabels)
}

selector_requirements(selector) := selector if {
	is_object(selector)
	not "matchLabels" in object.keys(selector)
	not "matchExpressions" in object.keys(selector)
	_string_map(selector)
}

_string_map(obj) if {
	is_object(obj)
	every value in obj {
		is_string(value)
	}
}

# METADATA
# description: A policy's requirements per scope, or undefined when a selector is malformed.
requirements(policy) := {scope: reqs |
	some scope in _scopes
	reqs := selector_requirements(object.get(policy, ["spec", "selectors", _selector_field[scope]], null))
}

_selector_field := {
	"virtualMachineInstance": "virtualMachineInstanceSelector",
	"namespace": "namespaceSelector",
}

_well_formed(policy) if {
	is_string(policy.metadata.name)
	count(requirements(policy)) == count(_scopes)
}

# METADATA
# description: |
#   Everything about the policies that does not depend on the VMI: per policy its requirements,
#   precedence keys and configuration overrides, plus an anchor index. Each policy is filed
#   under one of its own requirements (its anchor); a VMI can only match policies filed under
#   one of its labels, or policies without requirements.
# entrypoint: true
index := {
	"policies": {entry.name: entry | some entry in _entries},
	"anchors": _anchored,
	"unconditional": {entry.name | some entry in _entries; entry.size == 0},
	"malformed": {name: msg |
		some policy in input.policies
		not _well_formed(policy)
		name := object.get(policy, ["metadata", "name"], "")
		msg := "spec.selectors: each selector must be a map of label key to string value or {matchLabels: {...}}"
	},
}

_entries contains entry if {
	some policy in input.policies
	_well_formed(policy)
	entry := _entry(policy.metadata.name, requirements(policy), object.get(policy, "spec", {}))
}

_entry(name, reqs, spec) := {
	"name": name,
	"requirements": reqs,
	"exact": {scope: {key: value | some key, value in reqs[scope]; value != ""} | some scope in _scopes},
	"present": {scope: {key: true | some key, _ in reqs[scope]} | some scope in _scopes},
	"size": count(reqs.virtualMachineInstance) + count(reqs.namespace),
	"vmiSize": count(reqs.virtualMachineInstance),
	"sortedKeys": sort(array.concat(
		[key | some key, _ in reqs.virtualMachineInstance],
		[key | some key, _ in reqs.namespace],
	)),
	"anchor": _anchor(reqs),
	"overrides": {field: value |
		some field in _settings.policyFields
		value := spec[field]
		value != null
	},
}

_anchor(reqs) := [scope, key, reqs[scope][key]] if {
	scope := [s | some s in _scopes; count(reqs[s]) > 0][0]
	key := min(object.keys(reqs[scope]))
} else := null

_anchored[scope][key][value] contains entry.name if {
	some entry in _entries
	[scope, key, value] := entry.anchor
}

# The per-VMI half. ---------------------------------------------------------------------------

_index := input.index if {
	input.index
} else := index

_namespace_name := object.get(input.vmi, ["metadata", "namespace"], "default")

_labels := {
	"virtualMachineInstance": object.get(input.vmi, ["metadata", "labels"], {}),
	# The API server gives every Namespace this label; derive it so it holds for unknown ones too.
	"namespace": object.union(
		{"kubernetes.io/metadata.name": _namespace_name},
		object.get(input, ["namespace", "metadata", "labels"], {}),
	),
}

_present := {scope: {key: true | some key, _ in _labels[scope]} | some scope in _scopes}

_candidates contains name if {
	some scope in _scopes
	some key, value in _labels[scope]
	some name in _index.anchors[scope][key][value]
}

_candidates contains name if {
	some scope in _scopes
	some key, _ in _labels[scope]
	some name in _index.anchors[scope][key][""]
}

_candidates contains name if some name in _index.unconditional

_matching contains name if {
	some name in _candidates
	matches(_index.policies[name])
}

# METADATA
# description: A policy matches when the VMI and its namespace carry every label it requires.
matches(entry) if {
	object.subset(_labels.virtualMachineInstance, entry.exact.virtualMachineInstance)
	object.subset(_labels.namespace, entry.exact.namespace)
	object.subset(_present.virtualMachineInstance, entry.present.virtualMachineInstance)
	object.subset(_present.namespace, entry.present.namespace)
}

# METADATA
# description: |
#   The precedence of a matching policy as a tuple; the smallest tuple wins.
#   default:  most matching labels, then the smaller sorted list of matching label keys, then
#             more matching VMI labels, then the policy name (design 000).
#   kubevirt: most matching labels, then more matching VMI labels, then the policy name.
rank(entry) := [0 - entry.size, entry.sortedKeys, 0 - entry.vmiSize, entry.name] if {
	_settings.precedence == "default"
}

rank(entry) := [0 - entry.size, 0 - entry.vmiSize, entry.name] if {
	_settings.precedence == "kubevirt"
}

_best := min({rank(_index.policies[name]) | some name in _matching})

_winner := _index.policies[_best[count(_best) - 1]]

# METADATA
# description: |
#   The effective MigrationConfiguration: KubeVirt's defaults, overlaid by the KubeVirt CR's
#   spec.configuration.migrations, overlaid by the fields the winning policy sets. A layer that
#   sets allowPostCopy but not allowWorkloadDisruption makes workload disruption follow it.
configuration := object.union(object.union_n(_layers), {"allowWorkloadDisruption": _workload_disruption})

_layers := [_settings.defaults, _cluster_configuration, _policy_overrides]

_cluster_configuration := {field: value |
	some field, value in object.get(input, ["kubevirt", "spec", "configuration", "migrations"], {})
	value != null
}

_policy_overrides := _winner.overrides if {
	_winner
} else := {}

_workload_disruption := settings[count(settings) - 1] if {
	settings := [setting | some layer in _layers; setting := _disruption_setting(layer)]
}

_disruption_setting(layer) := layer.allowWorkloadDisruption

_disruption_setting(layer) := layer.allowPostCopy if not "allowWorkloadDisruption" in object.keys(layer)

# METADATA
# description: |
#   The policy the VMI obeys (null when none matches), its number of matching labels, and the
#   effective migration configuration. Undefined when the bundle's settings are invalid.
# entrypoint: true
decision := {
	"policy": _winner_name,
	"matchingLabels": _winner_size,
	"configuration": configuration,
} if {
	count(settings_errors) == 0
}

_winner_name := _winner.name if {
	_winner
} else := null

_winner_size := _winner.size if {
	_winner
} else := 0

# METADATA
# description: |
#   Every policy, with whether it matched the VMI, how many of its required labels the VMI
#   carries, and why it won or lost. Matching policies come first in precedence order.
#   Looks at every policy: for people and audits, not for the hot path.
# entrypoint: true
explanation := {
	"precedence": _settings.precedence,
	"policy": _winner_name,
	"candidates": [candidate | some pair in sort(_explained); candidate := pair[1]],
} if {
	count(settings_errors) == 0
}

_explained contains [[0, rank(entry)], _explain(entry, "selected")] if {
	entry := _winner
}

_explained contains [[0, rank(entry)], _explain(entry, _lost_to_winner(entry, _winner))] if {
	some entry in _index.policies
	matches(entry)
	entry.name != _winner.name
}

_explained contains [[1, entry.name], _explain(entry, concat("; ", _unmet(entry)))] if {
	some entry in _index.policies
	not matches(entry)
}

_explain(entry, reason) := {
	"policy": entry.name,
	"matched": count(_unmet(entry)) == 0,
	"matchingLabels": entry.size - count(_unmet(entry)),
	"requiredLabels": entry.size,
	"reason": reason,
}

_unmet(entry) := [msg |
	some scope in _scopes
	some key, value in entry.requirements[scope]
	not _satisfied(_labels[scope], key, value)
	msg := _unmet_message(scope, key, value, _labels[scope])
]

_satisfied(labels, key, "") if labels[key]

_satisfied(labels, key, value) if labels[key] == value

_scope_name := {"virtualMachineInstance": "VMI", "namespace": "namespace"}

_unmet_message(scope, key, value, labels) := sprintf("%s label %s=%s required, %s has %s=%s", [
	_scope_name[scope], key, value, _scope_name[scope], key, labels[key],
]) if {
	labels[key]
} else := sprintf("%s label %s required, %s has none", [_scope_name[scope], key, _scope_name[scope]]) if {
	value == ""
} else := sprintf("%s label %s=%s required, %s has none", [_scope_name[scope], key, value, _scope_name[scope]])

_lost_to_winner(entry, winner) := sprintf("lost to %s: %d matching labels, fewer than its %d", [
	winner.name, entry.size, winner.size,
]) if {
	entry.size < winner.size
} else := sprintf("lost to %s: same %d matching labels, but keys %v sort after its %v", [
	winner.name, entry.size, entry.sortedKeys, winner.sortedKeys,
]) if {
	_settings.precedence == "default"
	entry.sortedKeys != winner.sortedKeys
} else := sprintf("lost to %s: tie so far, but %d matching VMI labels, fewer than its %d", [
	winner.name, entry.vmiSize, winner.vmiSize,
]) if {
	entry.vmiSize < winner.vmiSize
} else := sprintf("lost to %s: tie on every rule, its name sorts first", [winner.name])
