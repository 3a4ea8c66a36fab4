# METADATA
# title: MigrationPolicy precedence
# description: |
#   Which MigrationPolicy (migrations.kubevirt.io/v1alpha1) a VirtualMachineInstance obeys, and
#   the migration configuration that results (design proposal 000).
#
#   Input of `decision` and `explanation`:
#     vmi:       the VirtualMachineInstance as stored (metadata.namespace, metadata.labels)
#     namespace: its Namespace as stored (metadata.labels); absent when unknown
#     kubevirt:  the KubeVirt CR as stored (spec.configuration.migrations, and
#                status.observedKubeVirtVersion: the version the decisions are for); absent
#                when unknown
#     policies:  every MigrationPolicy as stored (without what its status writes change:
#                status, virt-rules' status annotations, resourceVersion, managedFields), or
#                instead
#     index:     the value of `index` for those policies. The engine evaluates `index` once per
#                policy set and passes it back, and partially evaluates `matching` with it (see
#                there). Plain JSON (no sets), so it keeps its meaning through a JSON round trip.
#
#   Input of `index`: policies, or instead of policies the `policies` and `malformed` of indexes
#   of parts of the policies as entries and malformed (so the engine computes a changed
#   policy's entry alone and reuses the others').
#
#   Settings (bundle data, data.virtrules.migration.policy.settings):
#     precedence:   "default" (design 000) or "kubevirt" (what upstream KubeVirt does). Also
#                   decides what a selector value "" requires: the key with any value in
#                   design 000, the key with the empty value in KubeVirt; and what a VMI
#                   without labels matches: the policies whose selectors it meets in design
#                   000, in KubeVirt every policy with spec.selectors (its matchPolicy reads
#                   neither selector of such a VMI), the first name winning.
#     defaults:     KubeVirt's documented MigrationConfiguration defaults
#     policyFields: the MigrationConfiguration fields a policy may set (an object field, as
#                   `experimental`, is merged field by field over the layers below)
#     since:        field -> the first KubeVirt version that stores it (semver without "v").
#                   For an older KubeVirt (per the CR's status.observedKubeVirtVersion) the
#                   field is in no configuration: the cluster would drop it. An unknown version
#                   gets every field.
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
# scope: document
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
	since := object.get(_settings, "since", {})
	is_object(since)
	some field, version in since
	not _semver(version)
	msg := sprintf("settings.since.%s: %v is not a version such as 1.9.0", [field, version])
}

settings_errors contains msg if {
	not is_object(object.get(_settings, "since", {}))
	msg := "settings.since: must be an object of field -> version"
}

_semver(v) if {
	is_string(v)
	semver.is_valid(v)
}

settings_errors contains msg if {
	not is_boolean(object.get(_settings, ["defaults", "allowPostCopy"], null))
	msg := "settings.defaults.allowPostCopy: must be a boolean (allowWorkloadDisruption follows it)"
}

# METADATA
# scope: document
# description: |
#   The label requirements of a policy selector in one shape: label key to value, where ""
#   requires the key with any value. Accepts the design's `{matchLabels: {...}}` and KubeVirt's
#   plain map; undefined for any other shape.
selector_requirements(null) := {}

# (An else rather than a definition per shape: the shapes exclude each other, and the plain
# map's test is skipped for a matchLabels selector.)
selector_requirements(selector) := selector.matchLabels if {
	is_object(selector)
	object.keys(selector) == {"matchLabels"}
	_string_map(selector.matchLabels)
} else := selector if {
	is_object(selector)
	keys := object.keys(selector)
	not "matchLabels" in keys
	not "matchExpressions" in keys
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

# METADATA
# description: |
#   Everything about the policies that does not depend on the VMI, computed once per policy
#   set: per policy its requirements, precedence tuple (`rank`) and effective configuration;
#   the precedence order (`order`: id -> name, `ids`: name -> id) and its parts (`parts`:
#   part -> ids, see `matching`); the configuration of a VMI no policy matches; the policy with spec.selectors
#   whose name sorts first (`firstNamed`, null when none: KubeVirt's choice for a VMI without
#   labels); and the policies the decision cannot use (`malformed`: name -> why). A policy's id is its position in the precedence
#   order, so the matching policy with the smallest id wins.
#   Also reads input.kubevirt. Undefined when the bundle's settings are invalid.
# entrypoint: true
index := {
	"policies": {entry.name: entry | some entry in _entries},
	"order": {_ids[position]: name | some position, name in _order},
	"ids": {name: _ids[position] | some position, name in _order},
	"parts": {format_int(i, 10): array.slice(_ids, start, _part_end(i)) | some i, start in _part_starts},
	"configuration": _configuration({}),
	"firstNamed": _first_named,
	"malformed": _malformed,
} if {
	count(settings_errors) == 0
}

_malformed := input.malformed if {
	input.entries
} else := {name: msg |
	some i, policy in input.policies
	not _requirements_at[i]
	name := object.get(policy, ["metadata", "name"], "")
	msg := "spec.selectors: each selector must be a map of label key to string value or {matchLabels: {...}}"
}

# Entries the engine computed before, by index of the policies in parts.
_entries contains entry if {
	some entry in input.entries
}

_entries contains entry if {
	not input.entries
	some i, reqs in _requirements_at
	policy := input.policies[i]
	vmi_size := count(reqs.virtualMachineInstance)
	precedence := {
		"name": policy.metadata.name,
		"size": vmi_size + count(reqs.namespace),
		"vmiSize": vmi_size,
		# the keys of both scopes, a key required in both twice
		"sortedKeys": sort(array.concat(
			sort(object.keys(reqs.virtualMachineInstance)),
			sort(object.keys(reqs.namespace)),
		)),
	}
	entry := object.union(precedence, {
		"hasSelectors": _has_selectors(policy),
		"requirements": reqs,
		"rank": rank(precedence),
		"configuration": _configuration(_overrides(object.get(policy, "spec", {}))),
	})
}

# The requirements of each well-formed policy (a string name, every selector well formed) by
# its position in input.policies: computed once for _entries and _malformed. A comprehension,
# not an object rule: _malformed looks it up per policy, and OPA evaluates an object rule's
# body again for each key looked up.
_requirements_at := {i: reqs | # regal ignore:prefer-set-or-object-rule
	some i, policy in input.policies
	is_string(policy.metadata.name)
	reqs := requirements(policy)
	count(reqs) == count(_scopes)
}

# KubeVirt matches a policy without spec.selectors (absent or null) to no VMI; `selectors: {}`
# matches every VMI.
default _has_selectors(_) := false

_has_selectors(policy) if object.get(policy, ["spec", "selectors"], null) != null

_first_named := min(names) if {
	names := {entry.name | some entry in _entries; entry.hasSelectors}
	count(names) > 0
} else := null

# The policy fields spec sets, picked out of spec by object.filter rather than looked up one
# field at a time.
_overrides(spec) := {field: _without_nulls(value) |
	some field, value in object.filter(spec, _settings.policyFields)
	value != null
} if {
	is_object(spec)
} else := {}

# An object field (experimental, its stallDetector) without its null fields, two levels deep:
# KubeVirt reads a null as unset.
_without_nulls(value) := {k: _without_nulls_inner(v) | some k, v in value; v != null} if is_object(value)

_without_nulls(value) := value if not is_object(value)

_without_nulls_inner(value) := {k: v | some k, v in value; v != null} if is_object(value)

_without_nulls_inner(value) := value if not is_object(value)

# Every policy's name in precedence order (by rank).
_order := [pair[1] | some pair in sort([[entry.rank, entry.name] | some entry in _entries])]

# A policy's id is its position in _order as a zero-padded string, so that ids sort as the
# positions do and can be object keys in JSON. _ids lists them in that order.
_ids := [sprintf(_id_format, [position]) | some position, _ in _order]

_id_format := sprintf("%%0%dd", [count(format_int(count(_order), 10))])

# Where each part of the precedence order starts: the first part is 64 policies, each next
# one four times the size of the one before, the last takes the rest.
_part_starts := [start |
	some i in numbers.range(0, 4)
	start := (64 * (bits.lsh(1, 2 * i) - 1)) / 3
]

_part_end(i) := _part_starts[i + 1] if {
	i + 1 < count(_part_starts)
} else := count(_ids)

# The per-VMI half. ---------------------------------------------------------------------------

# The index the engine passes, else the index of input.policies. (Two definitions rather than
# an else: partial evaluation leaves a rule with an else unevaluated, and `matching` with it.)
_index := input.index

_index := index if not input.index

# METADATA
# scope: document
# description: |
#   The names of the policies the VMI matches, by part of the precedence order ("0" to "4").
#   The winner is the matching policy that comes first: the decision looks at the parts in
#   order and stops at the first where a policy matches.
#   The engine partially evaluates this rule once per policy set, with input.index known and
#   input.vmi and input.namespace unknown, into data.partial.virtrules.migration.policy.matching:
#   one rule per policy, keyed by its name, whose body compares the VMI's labels with the
#   values the policy requires. OPA's rule index then finds the policies a VMI matches by its
#   labels instead of checking every policy. A policy's rule depends on its entry and part
#   alone, so after a change the engine partially evaluates only the policies whose entry or
#   part changed, with an index whose parts list only those.
matching[part] contains name if {
	some part, ids in input.index.parts
	some id in ids
	name := input.index.order[id]
	matches(input.index.policies[name])
}

# The same without an index from the engine. (Two definitions rather than one reading _index:
# partial evaluation then reads input.index directly, which costs half as much.)
matching[part] contains name if {
	not input.index
	some part, ids in index.parts
	some id in ids
	name := index.order[id]
	matches(index.policies[name])
}

# METADATA
# description: |
#   A policy matches when it has spec.selectors and the VMI and its namespace carry every label
#   it requires.
matches(entry) if {
	entry.hasSelectors
	every key, value in entry.requirements.virtualMachineInstance {
		_vmi_carries(key, value)
	}
	every key, value in entry.requirements.namespace {
		_namespace_carries(key, value)
	}
}

# METADATA
# scope: document
# description: |
#   The VMI (scope virtualMachineInstance) or its namespace (scope namespace) carries the label
#   key=value; with value "" in the default precedence, the key with any value.
carries("virtualMachineInstance", key, value) if _vmi_carries(key, value)

carries("namespace", key, value) if _namespace_carries(key, value)

# carries, one function per scope: the partial evaluation of `matching` then inlines the one
# scope's definitions for each requirement rather than trying both scopes' (a fifth of what
# partially evaluating a policy costs).
_vmi_carries(key, "") if {
	_any_value("")
	input.vmi.metadata.labels[key]
}

_vmi_carries(key, value) if {
	not _any_value(value)
	input.vmi.metadata.labels[key] == value
}

_namespace_carries(key, "") if {
	_any_value("")
	_label("namespace", key)
}

_namespace_carries(key, value) if {
	not _any_value(value)
	_label("namespace", key) == value
}

# A required value that any value satisfies: "" in design 000's order. KubeVirt compares
# values as they are, so there "" requires an empty value.
_any_value("") if _settings.precedence == "default"

# _label is the value of a label of the VMI or its namespace, read from input directly so that
# partial evaluation leaves a plain reference to input that OPA's rule index can use. The API
# server gives every Namespace the label kubernetes.io/metadata.name; it is derived here for
# namespaces that lack it or are unknown.
_label("virtualMachineInstance", key) := input.vmi.metadata.labels[key]

_label("namespace", key) := input.namespace.metadata.labels[key]

_label("namespace", "kubernetes.io/metadata.name") := _namespace_name if {
	not input.namespace.metadata.labels["kubernetes.io/metadata.name"]
}

_namespace_name := object.get(input.vmi, ["metadata", "namespace"], "default")

# METADATA
# scope: document
# description: |
#   The precedence of a matching policy as a tuple; the smallest tuple wins.
#   default:  most matching labels, then the smaller sorted list of matching label keys, then
#             more matching VMI labels, then the policy name (design 000).
#   kubevirt: most matching labels, then more matching VMI labels, then the policy name.
rank(entry) := [0 - entry.size, entry.sortedKeys, 0 - entry.vmiSize, entry.name] if {
	_settings.precedence == "default"
} else := [0 - entry.size, 0 - entry.vmiSize, entry.name] if {
	_settings.precedence == "kubevirt"
}

# The matching policy of highest precedence: the one with the smallest id. One branch per
# part of _part_starts, in order.
_best := best if {
	best := _first(_matching_in("0"))
} else := best if {
	best := _first(_matching_in("1"))
} else := best if {
	best := _first(_matching_in("2"))
} else := best if {
	best := _first(_matching_in("3"))
} else := _first(_matching_in("4"))

# The smallest id of the named policies; undefined for none.
_first(names) := min({_index.ids[name] | some name in names})

# The engine's partial evaluation of `matching` for the policy set when there is one, else
# `matching` itself: the two are the same. (A part the partial evaluation has rules for is
# defined, if empty, when no policy of it matches.)
_matching_in(part) := ids if {
	ids := data.partial.virtrules.migration.policy.matching[part]
} else := matching[part]

# KubeVirt v1.8's matchPolicy compares a policy's VMI selector, and its namespace selector,
# only with a VMI that has labels: for one without any (as the API server stores it, no
# metadata.labels; KubeVirt gives every running VMI kubevirt.io/nodeName, but inputs given to
# `eval` often have none) every policy with spec.selectors matches with 0 labels and the first
# name wins. The kubevirt precedence does the same; design 000 does not copy it.
_selectors_ignored if {
	_settings.precedence == "kubevirt"
	not _vmi_labelled
}

_vmi_labelled if {
	some _ in input.vmi.metadata.labels
}

_winner := _index.policies[_index.firstNamed] if {
	_selectors_ignored
} else := _index.policies[_index.order[_best]]

# The number of matching labels of the winner: 0 where KubeVirt reads no selector.
_matching_labels(entry) := 0 if {
	_selectors_ignored
} else := entry.size

# METADATA
# description: |
#   The effective MigrationConfiguration: KubeVirt's defaults, overlaid by the KubeVirt CR's
#   spec.configuration.migrations, overlaid by the fields the winning policy sets. A layer that
#   sets allowPostCopy but not allowWorkloadDisruption makes workload disruption follow it.
configuration := _winner.configuration if {
	_winner
} else := _index.configuration

_configuration(overrides) := object.remove(
	object.union_n([_cluster_defaults, overrides, {"allowWorkloadDisruption": _disruption_over(overrides)}]),
	_dropped_fields,
)

# METADATA
# description: |
#   The KubeVirt version the decisions are for: the KubeVirt CR's status.observedKubeVirtVersion
#   (as virt-operator writes it) without its "v"; "" when unknown.
kubevirt_version := trim_prefix(version, "v") if {
	version := input.kubevirt.status.observedKubeVirtVersion
	is_string(version)
	_semver(trim_prefix(version, "v"))
} else := ""

# The fields that version of KubeVirt does not store.
_dropped_fields contains field if {
	kubevirt_version != ""
	since_map := object.get(_settings, "since", {})
	is_object(since_map)
	some field, since in since_map
	_semver(since)
	semver.compare(kubevirt_version, since) < 0
}

# The two layers under every policy's overrides, merged once per policy set.
_cluster_defaults := object.union(_settings.defaults, _cluster_configuration)

# A policy that sets neither allowWorkloadDisruption nor allowPostCopy keeps the layers' below.
_disruption_over(overrides) := setting if {
	setting := _disruption_setting(overrides)
} else := _cluster_disruption

# The layers' allowWorkloadDisruption, once per policy set rather than per policy.
_cluster_disruption := _workload_disruption([_settings.defaults, _cluster_configuration])

_cluster_configuration[field] := value if {
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
decision := {"policy": _winner.name, "matchingLabels": _matching_labels(_winner), "configuration": _winner.configuration} if {
	_winner
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
	"candidates": [pair[1] | some pair in sort(_explained)],
} if {
	count(settings_errors) == 0
}

_explained contains [[0, _explained_rank(_winner)], _explain(_winner, "selected")] if _winner

_explained contains [[0, _explained_rank(entry)], _explain(entry, _lost_to_winner(entry, _winner))] if {
	some entry in _index.policies
	_applies(entry)
	entry.name != _winner.name
}

_explained contains [[1, entry.name], _explain(entry, _mismatch(entry))] if {
	some entry in _index.policies
	not _applies(entry)
}

# The policy matches the VMI as the decision sees it: every policy with selectors where
# KubeVirt reads none (_selectors_ignored).
_applies(entry) if {
	not _selectors_ignored
	matches(entry)
}

_applies(entry) if {
	_selectors_ignored
	entry.hasSelectors
}

_explained_rank(entry) := [entry.name] if {
	_selectors_ignored
} else := rank(entry)

_matched(entry) if _applies(entry)

_matched(entry) := false if not _applies(entry)

_mismatch(entry) := "no spec.selectors: a policy without selectors matches no VMI (selectors: {} matches every VMI)" if {
	not entry.hasSelectors
} else := concat("; ", _unmet(entry))

_explain(entry, reason) := {
	"policy": entry.name,
	"matched": _matched(entry),
	"matchingLabels": _explained_labels(entry),
	"requiredLabels": entry.size,
	"reason": reason,
}

# How many of its required labels the VMI carries: none where KubeVirt reads no selector.
_explained_labels(entry) := 0 if {
	_selectors_ignored
} else := entry.size - count(_unmet(entry))

_unmet(entry) := [msg |
	some scope in _scopes
	some key, value in entry.requirements[scope]
	not carries(scope, key, value)
	msg := _unmet_message(scope, key, value)
]

_scope_name := {"virtualMachineInstance": "VMI", "namespace": "namespace"}

_unmet_message(scope, key, value) := sprintf("%s label %s=%s required, %s has %s=%s", [
	_scope_name[scope], key, _shown_value(value), _scope_name[scope], key, _shown_value(_label(scope, key)),
]) if {
	_label(scope, key)
} else := sprintf("%s label %s required, %s has none", [_scope_name[scope], key, _scope_name[scope]]) if {
	_any_value(value)
} else := sprintf("%s label %s=%s required, %s has none", [_scope_name[scope], key, _shown_value(value), _scope_name[scope]])

# A label value in a message; the empty value as "".
_shown_value("") := `""`

_shown_value(value) := value if value != ""

_lost_to_winner(entry, winner) := sprintf("lost to %s: the VMI has no labels, so KubeVirt reads no selector and every policy with selectors ties; its name sorts first", [
	winner.name,
]) if {
	_selectors_ignored
} else := sprintf("lost to %s: %d matching labels, fewer than its %d", [
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
