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
#                policy set and passes it back, so one decision looks up the policies filed
#                under the VMI's labels instead of checking every policy. Plain JSON (no sets),
#                so it keeps its meaning through a JSON round trip.
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
#   Everything about the policies that does not depend on the VMI, computed once per policy
#   set: per policy its requirements, precedence tuple (`rank`) and effective configuration,
#   the configuration of a VMI no policy matches, the precedence order, and an anchor index.
#   A policy's id is its position in the precedence order, so the matching policy with the
#   smallest id wins. Each policy is filed under its anchors: the two labelled values it
#   requires that the fewest policies share (a VMI carries both only if it carries each), or
#   its only labelled value, or its least shared key-only requirement. `anchors` maps each
#   first anchor (scope -> key -> value, "" for key-only) to a node of the policies filed under
#   it alone, with, in `pairs` (scope -> key -> value), a node per second anchor. A node keeps
#   the smallest id of its policies that require nothing besides their anchors (`first`: they
#   all match when the anchors do, and only the first can win) and what the others require
#   besides their anchors (`others`: id -> labels (scope -> key -> value) and keys (scope ->
#   key -> true), each omitted when empty). A VMI can only match policies filed under its
#   labels, or policies without requirements (`unconditional`). `firstAnchoredOnly` is the
#   smallest id of a policy that requires nothing besides its anchors, null if none does.
#   Also reads input.kubevirt. Undefined when the bundle's settings are invalid.
# entrypoint: true
index := {
	"policies": {entry.name: entry | some entry in _entries},
	"order": {_ids[name]: name | some name in _order},
	"anchors": _anchors,
	"unconditional": [_ids[entry.name] | some entry in _entries; entry.size == 0],
	"firstAnchoredOnly": _first_anchored_only,
	"configuration": _configuration({}),
	"malformed": {name: msg |
		some policy in input.policies
		not _well_formed(policy)
		name := object.get(policy, ["metadata", "name"], "")
		msg := "spec.selectors: each selector must be a map of label key to string value or {matchLabels: {...}}"
	},
} if {
	count(settings_errors) == 0
}

# _facts are what the index keeps of each well-formed policy before anchors are chosen.
_facts contains fact if {
	some policy in input.policies
	is_string(policy.metadata.name) # as in _well_formed, without computing requirements twice
	reqs := requirements(policy)
	count(reqs) == count(_scopes)
	fact := {
		"name": policy.metadata.name,
		"requirements": reqs,
		"labels": [[scope, key, value] | some scope in _scopes; some key, value in reqs[scope]],
		"overrides": _overrides(object.get(policy, "spec", {})),
	}
}

_overrides(spec) := {field: value |
	some field in _settings.policyFields
	value := spec[field]
	value != null
}

# How many policies require each labelled value (key-only requirements as value "").
_sharing := {label: count(holders) | some label, holders in _grouped([[label, fact.name] |
	some fact in _facts
	some label in fact.labels
])}

# _grouped turns [key, member] pairs into key -> member -> true in one pass: object.union_n merges
# nested objects in place. (A comprehension per key that compares the key to every pair is not
# indexed by OPA here: it reads all pairs once per key, n² for n policies.)
_grouped(pairs) := object.union_n([{pair[0]: {pair[1]: true}} | some pair in pairs])

_entries contains entry if {
	some fact in _facts
	reqs := fact.requirements
	precedence := {
		"name": fact.name,
		"size": count(fact.labels),
		"vmiSize": count(reqs.virtualMachineInstance),
		"sortedKeys": sort([label[1] | some label in fact.labels]),
	}
	entry := {
		"name": fact.name,
		"requirements": reqs,
		"exact": {scope: {key: value | some key, value in reqs[scope]; value != ""} | some scope in _scopes},
		"keyOnly": {scope: keys |
			some scope in _scopes
			keys := {key: true | some key, value in reqs[scope]; value == ""}
			count(keys) > 0
		},
		"size": precedence.size,
		"vmiSize": precedence.vmiSize,
		"sortedKeys": precedence.sortedKeys,
		"rank": rank(precedence),
		"anchors": _anchors_of(fact.labels),
		"configuration": _configuration(fact.overrides),
	}
}

# _anchors_of picks the requirements a policy is filed under: the two labelled values the
# fewest policies share, or its only labelled value, or the key-only requirement the fewest
# share (one admits every VMI with the key); none without requirements.
_anchors_of(labels) := _anchors_among(sort([[_sharing[label], label] | some label in labels; label[2] != ""]), labels)

# _anchors_among: ranked are the policy's labelled values as [sharing, label], fewest first.
_anchors_among(ranked, labels) := [ranked[0][1], ranked[1][1]] if {
	count(ranked) >= 2
} else := [ranked[0][1]] if {
	count(ranked) == 1
} else := [min([[_sharing[label], label] | some label in labels])[1]] if {
	count(labels) > 0
} else := []

# Every policy's name in precedence order (by rank).
_order := [pair[1] | some pair in sort([[entry.rank, entry.name] | some entry in _entries])]

# A policy's id is its position in _order as a zero-padded string, so that ids sort as the
# positions do and can be object keys in JSON.
_ids := {name: sprintf(_id_format, [position]) | some position, name in _order}

_id_format := sprintf("%%0%dd", [count(format_int(count(_order), 10))])

_entry := {entry.name: entry | some entry in _entries}

# The policies filed under each list of anchors.
_filed := {anchors: [_entry[name] | some name, _ in names] |
	some anchors, names in _grouped([[entry.anchors, entry.name] | some entry in _entries; count(entry.anchors) > 0])
}

# Per first anchor (scope -> key -> value): the node of the policies filed under it alone, and
# in `pairs` the node of the policies filed under it and each second anchor.
_anchors := object.union_n([_at(first, object.union(_node_of([first]), _pairs_of(lists))) |
	some first, lists in _grouped([[anchors[0], anchors] | some anchors, _ in _filed])
])

_pairs_of(lists) := {"pairs": object.union_n([_at(anchors[1], _node_of(anchors)) |
	some anchors, _ in lists
	count(anchors) == 2
])} if {
	some anchors, _ in lists
	count(anchors) == 2
} else := {}

# _at nests x under a requirement: {scope: {key: {value: x}}}.
_at(label, x) := {label[0]: {label[1]: {label[2]: x}}}

_node_of(anchors) := object.union_n([
	{"first": min(ids) |
		ids := [_ids[m.name] | some m in _filed[anchors]; m.size == count(anchors)]
		count(ids) > 0
	},
	{"others": others |
		others := {_ids[m.name]: _others(m, anchors) |
			some m in _filed[anchors]
			m.size > count(anchors)
		}
		count(others) > 0
	},
]) if {
	_filed[anchors]
} else := {}

# What a policy requires besides its anchors: labelled values (scope -> key -> value) and keys
# with any value (scope -> key -> true).
_other_labelled_values(entry, anchors) := {scope: values |
	some scope in _scopes
	values := {key: value | some key, value in entry.requirements[scope]; value != ""; not [scope, key, value] in anchors}
	count(values) > 0
}

_others(entry, anchors) := object.union_n([
	{"labels": values | values := _other_labelled_values(entry, anchors); count(values) > 0},
	{"keys": keys | keys := _other_keys(entry, anchors); count(keys) > 0},
])

_other_keys(entry, anchors) := {scope: keys |
	some scope in _scopes
	keys := {key: true | some key, value in entry.requirements[scope]; value == ""; not [scope, key, value] in anchors}
	count(keys) > 0
}

_first_anchored_only := min(ids) if {
	ids := [_ids[entry.name] | some entry in _entries; entry.size == count(entry.anchors)]
	count(ids) > 0
} else := null

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

# Presence of label keys, for key-only requirements.
_present := {scope: {key: true | some key, _ in _labels[scope]} | some scope in _scopes}

# The rows of the VMI's labels: the node filed under each label's value and under its key
# (key-only anchors). Only policies filed there, or without requirements, can match.
_rows := [row |
	anchors := _index.anchors
	labels := _labels
	some scope, by_key in anchors
	some key, value in labels[scope]
	by_value := by_key[key]
	some anchor in [value, ""]
	row := by_value[anchor]
]

# The nodes the VMI reaches: its rows, and the pairs whose second anchor it carries too. A
# decision looks up a few nodes per label rather than checking every policy filed there.
_nodes := array.concat(_rows, [node |
	labels := _labels
	some row in _rows
	some scope, by_key in row.pairs
	some key, by_value in by_key
	node := by_value[labels[scope][key]]
])

# The ids of the policies in the VMI's nodes that require more than their anchors and match:
# one object.subset each, against the VMI's labels and the presence of its label keys.
_matching_others := [id |
	some node in _nodes
	some id, others in node.others
	object.subset(_carried, others)
]

_carried := {"labels": _labels, "keys": _present}

# METADATA
# description: A policy matches when the VMI and its namespace carry every label it requires.
matches(entry) if {
	object.subset(_labels.virtualMachineInstance, entry.exact.virtualMachineInstance)
	object.subset(_labels.namespace, entry.exact.namespace)
	_carries_required_keys(entry)
}

# _carries_required_keys: the VMI and namespace have every key the policy requires with any
# value. Most policies have none, so that case is decided without building _present.
_carries_required_keys(entry) if count(entry.keyOnly) == 0

_carries_required_keys(entry) if {
	count(entry.keyOnly) > 0
	every scope, keys in entry.keyOnly {
		object.subset(_present[scope], keys)
	}
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

# The matching policy of highest precedence: the one with the smallest id. A matching policy
# that requires more than its anchors and comes before every policy that does not wins without
# looking at the nodes' first policies.
_best := best if {
	best := min(_matching_others)
	best < _index.firstAnchoredOnly
} else := min(array.concat(
	array.concat(_index.unconditional, _matching_others),
	[node.first | some node in _nodes],
))

_winner := _index.policies[_index.order[_best]]

# METADATA
# description: |
#   The effective MigrationConfiguration: KubeVirt's defaults, overlaid by the KubeVirt CR's
#   spec.configuration.migrations, overlaid by the fields the winning policy sets. A layer that
#   sets allowPostCopy but not allowWorkloadDisruption makes workload disruption follow it.
configuration := _winner.configuration if {
	_winner
} else := _index.configuration

_configuration(overrides) := object.union(
	object.union(_cluster_defaults, overrides),
	{"allowWorkloadDisruption": _disruption_over(overrides)},
)

# The two layers under every policy's overrides, merged once per policy set.
_cluster_defaults := object.union(_settings.defaults, _cluster_configuration)

# A policy that sets neither allowWorkloadDisruption nor allowPostCopy keeps the layers' below.
_disruption_over(overrides) := setting if {
	setting := _disruption_setting(overrides)
} else := _workload_disruption([_settings.defaults, _cluster_configuration])

_cluster_configuration := {field: value |
	some field, value in object.get(input, ["kubevirt", "spec", "configuration", "migrations"], {})
	value != null
}

_workload_disruption(layers) := settings[count(settings) - 1] if {
	settings := [setting | some layer in layers; setting := _disruption_setting(layer)]
}

_disruption_setting(layer) := layer.allowWorkloadDisruption

_disruption_setting(layer) := layer.allowPostCopy if not "allowWorkloadDisruption" in object.keys(layer)

# METADATA
# description: |
#   The policy the VMI obeys (null when none matches), its number of matching labels, and the
#   effective migration configuration. Undefined when the bundle's settings are invalid.
# entrypoint: true
decision := {"policy": winner.name, "matchingLabels": winner.size, "configuration": winner.configuration} if {
	winner := _winner
} else := {"policy": null, "matchingLabels": 0, "configuration": _index.configuration}

_winner_name := _winner.name if {
	_winner
} else := null

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
