# METADATA
# title: MigrationPolicy validation
# description: |
#   Whether a MigrationPolicy (migrations.kubevirt.io/v1alpha1) may be admitted, for a validating
#   admission webhook and for offline checks (design proposal 000).
#
#   Input:
#     policy:    the MigrationPolicy being admitted, as stored
#     policies:  the other existing MigrationPolicies; one with the same metadata.name as
#                `policy` is the old version of the same object and is ignored. It may hold only
#                those whose `selector_keys` entry is the policy's own, and none when the
#                policy's is null: no other can make a difference to `decision` (the engine
#                passes these).
#     oldPolicy: on an update, the version it replaces, as stored; absent on a create
#     kubevirt:  the cluster's KubeVirt CR, as stored; absent when unknown, and then the checks
#                that read it (feature gates) are not made
#
#   Input of `selector_keys`: policies.
#
#   Selectors are read the way data.virtrules.migration.policy reads them, so a policy admitted
#   here is never `malformed` there. Its settings.precedence "kubevirt" admits what KubeVirt
#   admits: two policies with the same selectors too.
package virtrules.migration.policy.validation

# The parent package, not this one: Regal's pointless-import takes a parent for the own package.
# regal ignore:pointless-import
import data.virtrules.migration.policy

# METADATA
# description: Whether the MigrationPolicy may be admitted, and every violation, sorted.
# entrypoint: true
decision := {
	"allowed": count(violations) == 0,
	"violations": sort(violations),
}

# METADATA
# description: |
#   What is wrong with input.policy, each as {"field": <JSON path>, "message": <for a cluster
#   admin, naming the offending value>}.
# scope: document
violations contains {"field": "", "message": msg} if {
	doc := object.get(input, "policy", null)
	not is_object(doc)
	msg := sprintf("the MigrationPolicy must be an object, got %s", [_shown(doc)])
}

# The policy being admitted; undefined when it is not an object, so no other check runs.
_policy := input.policy if is_object(input.policy)

# Name and spec ---------------------------------------------------------------------------------

_name := object.get(_policy, ["metadata", "name"], null)

violations contains {"field": "metadata.name", "message": "metadata.name is missing"} if {
	_name in {null, ""}
}

violations contains {"field": "metadata.name", "message": msg} if {
	_name != null
	not is_string(_name)
	msg := sprintf("metadata.name must be a string, got %s", [_shown(_name)])
}

violations contains {"field": "spec", "message": msg} if {
	spec := object.get(_policy, "spec", null)
	spec != null
	not is_object(spec)
	msg := sprintf("spec must be an object, got %s", [_shown(spec)])
}

# Selectors -------------------------------------------------------------------------------------

_selector_fields := {"virtualMachineInstanceSelector", "namespaceSelector"}

_selectors := object.get(_policy, ["spec", "selectors"], null)

# The selectors the policy sets (null means absent, the same as an empty selector).
_given_selectors[field] := selector if {
	some field in _selector_fields
	selector := object.get(_policy, ["spec", "selectors", field], null)
	selector != null
}

violations contains {"field": "spec.selectors", "message": msg} if {
	_selectors != null
	not is_object(_selectors)
	msg := sprintf("spec.selectors must be an object with virtualMachineInstanceSelector and/or namespaceSelector, got %s", [_shown(_selectors)])
}

violations contains {"field": concat(".", ["spec.selectors", key]), "message": msg} if {
	is_object(_selectors)
	some key, _ in _selectors
	not key in _selector_fields
	msg := sprintf("unknown selector %q: the selectors are virtualMachineInstanceSelector and namespaceSelector", [key])
}

violations contains {"field": path, "message": msg} if {
	some field, selector in _given_selectors
	not is_object(selector)
	path := concat(".", ["spec.selectors", field])
	msg := sprintf("%s must be a map of label key to value or {matchLabels: {...}}, got %s", [path, _shown(selector)])
}

violations contains {"field": concat(".", ["spec.selectors", field, "matchExpressions"]), "message": msg} if {
	some field, selector in _given_selectors
	_has_key(selector, "matchExpressions")
	msg := "matchExpressions is not supported: select with matchLabels or a plain map of label key to value"
}

violations contains {"field": concat(".", ["spec.selectors", field, key]), "message": msg} if {
	some field, selector in _given_selectors
	_has_key(selector, "matchLabels")
	some key, _ in selector
	not key in {"matchLabels", "matchExpressions"}
	msg := sprintf("%q beside matchLabels: a selector is either {matchLabels: {...}} or a plain map of label key to value, not both", [key])
}

# The label maps of the selectors, as [JSON path, map]: matchLabels, or the plain map itself.
_label_maps contains [concat(".", ["spec.selectors", field, "matchLabels"]), selector.matchLabels] if {
	some field, selector in _given_selectors
	_has_key(selector, "matchLabels")
}

_label_maps contains [concat(".", ["spec.selectors", field]), object.remove(selector, {"matchExpressions"})] if {
	some field, selector in _given_selectors
	is_object(selector)
	not _has_key(selector, "matchLabels")
}

violations contains {"field": path, "message": msg} if {
	some [path, labels] in _label_maps
	not is_object(labels)
	msg := sprintf("%s must be a map of label key to string value, got %s", [path, _shown(labels)])
}

violations contains {"field": concat(".", [path, key]), "message": msg} if {
	some [path, labels] in _label_maps
	is_object(labels)
	some key, value in labels
	not is_string(value)
	msg := sprintf("label %q must have a string value, got %s; quote it in YAML", [key, _shown(value)])
}

violations contains {"field": concat(".", [path, key]), "message": _key_problem(key)} if {
	some [path, labels] in _label_maps
	is_object(labels)
	some key, _ in labels
}

violations contains {"field": concat(".", [path, key]), "message": _value_problem(key, value)} if {
	some [path, labels] in _label_maps
	is_object(labels)
	some key, value in labels
	is_string(value)
}

# Label syntax (Kubernetes' validation of label keys and values) ----------------------------------

_dns_subdomain := `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`

_label_name := `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`

_name_rule := "letters, digits, '-', '_' and '.', starting and ending with a letter or digit"

# The first problem with a label key, undefined when it is valid: an optional DNS subdomain
# prefix and '/', then a name.
_key_problem(key) := sprintf("label key %q has more than one '/'", [key]) if {
	count(split(key, "/")) > 2
} else := problem if {
	[prefix, _] := split(key, "/")
	problem := _prefix_problem(key, prefix)
} else := _name_problem(key, _key_name(key))

_key_name(key) := name if {
	[_, name] := split(key, "/")
} else := key

_prefix_problem(key, "") := sprintf("label key %q has an empty prefix before '/'", [key])

_prefix_problem(key, prefix) := sprintf("label key %q: prefix %q is longer than 253 characters", [key, prefix]) if {
	count(prefix) > 253
}

_prefix_problem(key, prefix) := msg if {
	prefix != ""
	count(prefix) <= 253
	not regex.match(_dns_subdomain, prefix)
	msg := sprintf("label key %q: prefix %q must be a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit", [key, prefix])
}

_name_problem(key, "") := sprintf("label key %q has an empty name", [key])

_name_problem(key, name) := sprintf("label key %q: name %q is longer than 63 characters", [key, name]) if {
	count(name) > 63
}

_name_problem(key, name) := sprintf("label key %q: name %q must be %s", [key, name, _name_rule]) if {
	name != ""
	count(name) <= 63
	not regex.match(_label_name, name)
}

_value_problem(key, value) := sprintf("label %q: value %q... (%d characters) is longer than 63 characters", [key, substring(value, 0, 20), count(value)]) if {
	count(value) > 63
}

_value_problem(key, value) := sprintf("label %q: value %q must be empty or %s", [key, value, _name_rule]) if {
	value != ""
	count(value) <= 63
	not regex.match(_label_name, value)
}

# Migration configuration -----------------------------------------------------------------------

# The configuration fields the policy sets (null means not set).
_set_fields[field] := value if {
	spec := object.get(_policy, "spec", {})
	is_object(spec)
	some field, value in spec
	value != null
}

_booleans := {"allowAutoConverge", "allowPostCopy", "allowWorkloadDisruption"}

violations contains {"field": concat(".", ["spec", field]), "message": msg} if {
	some field in _booleans
	value := _set_fields[field]
	not is_boolean(value)
	msg := sprintf("%s must be true or false, got %s", [field, _shown(value)])
}

violations contains {"field": "spec.bandwidthPerMigration", "message": _bandwidth_problem(_set_fields.bandwidthPerMigration)}

# A Kubernetes quantity: a signed decimal number, then a binary or decimal SI suffix or an exponent.
_quantity := `^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$`

_bandwidth_problem(value) := sprintf("bandwidthPerMigration must not be negative, got %v", [value]) if {
	is_number(value)
	value < 0
} else := msg if {
	is_string(value)
	not regex.match(_quantity, value)
	msg := sprintf("bandwidthPerMigration %q is not a quantity such as 64Mi, 1Gi, 100M or 1e9", [value])
} else := sprintf("bandwidthPerMigration must not be negative, got %q", [value]) if {
	is_string(value)
	_negative_quantity(value)
} else := msg if {
	not is_number(value)
	not is_string(value)
	msg := sprintf("bandwidthPerMigration must be a quantity such as \"64Mi\" or a number of bytes, got %s", [_shown(value)])
}

# A '-' and a number with a non-zero digit: "-0Mi" is zero, "-0.5Mi" is negative.
_negative_quantity(quantity) if regex.match(`^-[0-9.]*[1-9]`, quantity)

violations contains {"field": "spec.completionTimeoutPerGiB", "message": msg} if {
	value := _set_fields.completionTimeoutPerGiB
	not _integer(value)
	msg := sprintf("completionTimeoutPerGiB must be an integer number of seconds, got %s", [_shown(value)])
}

violations contains {"field": "spec.completionTimeoutPerGiB", "message": msg} if {
	value := _set_fields.completionTimeoutPerGiB
	_integer(value)
	value < 0
	msg := sprintf("completionTimeoutPerGiB must not be negative, got %v", [value])
}

violations contains {"field": "spec.maxDowntimeMs", "message": msg} if {
	value := _set_fields.maxDowntimeMs
	not _integer(value)
	msg := sprintf("maxDowntimeMs must be an integer number of milliseconds, got %s", [_shown(value)])
}

violations contains {"field": "spec.maxDowntimeMs", "message": msg} if {
	value := _set_fields.maxDowntimeMs
	_integer(value)
	not _between(value, 1, 2000000)
	msg := sprintf("maxDowntimeMs must be between 1 and 2000000, got %v", [value])
}

_integer(value) if {
	is_number(value)
	floor(value) == value
}

_between(value, low, high) if {
	value >= low
	value <= high
}

# Experimental options (KubeVirt v1.9: stall detector, compression) ------------------------------
#
# KubeVirt's schema and admission check these; the ranges and the factor syntax are theirs.

violations contains {"field": "spec.experimental", "message": msg} if {
	value := _set_fields.experimental
	not is_object(value)
	msg := sprintf("experimental must be an object with stallDetector and/or compression, got %s", [_shown(value)])
}

# The experimental options the policy sets (null means not set).
_experimental[field] := value if {
	is_object(_set_fields.experimental)
	some field, value in _set_fields.experimental
	value != null
}

violations contains {"field": "spec.experimental.compression", "message": msg} if {
	value := _experimental.compression
	not value in {"none", "zstd"}
	msg := sprintf(`experimental.compression must be "none" or "zstd", got %s`, [_shown(value)])
}

violations contains {"field": "spec.experimental.stallDetector", "message": msg} if {
	value := _experimental.stallDetector
	not is_object(value)
	msg := sprintf("experimental.stallDetector must be an object of stall detector options, got %s", [_shown(value)])
}

# The stall detector options the policy sets (null means not set).
_stall[field] := value if {
	is_object(_experimental.stallDetector)
	some field, value in _experimental.stallDetector
	value != null
}

_stall_path(field) := concat(".", ["spec.experimental.stallDetector", field])

violations contains {"field": _stall_path("stallMargin"), "message": msg} if {
	value := _stall.stallMargin
	not _integer_between(value, 0, 100)
	msg := sprintf("stallMargin must be an integer percentage from 0 to 100, got %s", [_shown(value)])
}

violations contains {"field": _stall_path(field), "message": msg} if {
	some field in {"stallProgressTimeout", "switchoverTimeout"}
	value := _stall[field]
	not _non_negative_integer(value)
	msg := sprintf("%s must be a non-negative integer number of seconds, got %s", [field, _shown(value)])
}

violations contains {"field": _stall_path("searchLocalMinima"), "message": msg} if {
	value := _stall.searchLocalMinima
	not is_boolean(value)
	msg := sprintf("searchLocalMinima must be true or false, got %s", [_shown(value)])
}

# The factors: decimal strings with at most 3 decimal places, in a range. Bounds: [low, high],
# where low is exclusive when the third element is true; null is unbounded.
_factors := {
	"ewmaAlpha": [0, 1, true],
	"precopyPossibleFactor": [1, null, false],
	"patienceWindowDecayFactor": [0, 1, false],
	"completionTimeoutFactor": [1, null, false],
}

violations contains {"field": _stall_path(field), "message": msg} if {
	some field, bounds in _factors
	value := _stall[field]
	msg := _factor_problem(field, value, bounds)
}

_decimal := `^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$`

_factor_problem(field, value, bounds) := sprintf(`%s must be a decimal number in a string, such as "0.5", got %s`, [field, _shown(value)]) if {
	not is_string(value)
} else := sprintf("%s %q is not a decimal number", [field, value]) if {
	not regex.match(_decimal, trim_space(value))
} else := sprintf("%s %q has more than 3 decimal places", [field, value]) if {
	number := to_number(trim_space(value))
	abs(number - (round(number * 1000) / 1000)) > 0.000000001
} else := sprintf("%s must be greater than %v, got %q", [field, bounds[0], value]) if {
	bounds[2]
	to_number(trim_space(value)) <= bounds[0]
} else := sprintf("%s must be at least %v, got %q", [field, bounds[0], value]) if {
	not bounds[2]
	to_number(trim_space(value)) < bounds[0]
} else := sprintf("%s must be at most %v, got %q", [field, bounds[1], value]) if {
	bounds[1] != null
	to_number(trim_space(value)) > bounds[1]
}

_integer_between(value, low, high) if {
	_integer(value)
	_between(value, low, high)
}

_non_negative_integer(value) if {
	_integer(value)
	value >= 0
}

# Feature gates ---------------------------------------------------------------------------------
#
# KubeVirt (v1.9 on) admits a policy that sets spec.maxDowntimeMs or
# spec.experimental.stallDetector, or changes it from the version it replaces, only when the
# KubeVirt CR enables the alpha feature gate MigrationStallDetection (listed in
# spec.configuration.developerConfiguration.featureGates). A value left as it was passes, as
# a null or absent one. Checked when the input carries the KubeVirt CR, for a KubeVirt that
# stores the field (settings.since of data.virtrules.migration.policy; any, when its version
# is unknown).

_stall_detection_gate := "MigrationStallDetection"

# The gated fields: name in messages -> path in a policy, and the settings.since entry.
_gated := {
	"maxDowntimeMs": {"path": ["spec", "maxDowntimeMs"], "since": "maxDowntimeMs"},
	"experimental.stallDetector": {"path": ["spec", "experimental", "stallDetector"], "since": "experimental"},
}

violations contains {"field": concat(".", ["spec", name]), "message": msg} if {
	_stall_detection_off
	some name, gated in _gated
	_stored_by_cluster(gated.since)
	value := _without_nulls(object.get(_policy, gated.path, null))
	value != null
	value != _without_nulls(object.get(input, array.concat(["oldPolicy"], gated.path), null))
	msg := sprintf("setting or changing %s needs the %s feature gate, which the KubeVirt CR does not enable (spec.configuration.developerConfiguration.featureGates)", [name, _stall_detection_gate])
}

_stall_detection_off if {
	is_object(input.kubevirt)
	gates := object.get(input.kubevirt, ["spec", "configuration", "developerConfiguration", "featureGates"], [])
	not _stall_detection_gate in _list(gates)
}

_list(value) := value if is_array(value)

_list(value) := [] if not is_array(value)

# Whether the cluster's KubeVirt stores a field (settings.since): any field when its version is
# unknown.
_stored_by_cluster(_) if policy.kubevirt_version == ""

_stored_by_cluster(field) if {
	since := object.get(policy.settings, ["since", field], "0.0.0")
	semver.compare(policy.kubevirt_version, since) >= 0
}

# A value without its null fields (KubeVirt reads a null as unset), one level deep.
_without_nulls(value) := {k: v | some k, v in value; v != null} if is_object(value)

_without_nulls(value) := value if not is_object(value)

# Same selectors --------------------------------------------------------------------------------

# Design 000 forbids two policies with the same selectors. KubeVirt admits them and lets the
# name decide: under `settings.precedence: "kubevirt"` so does this check.
violations contains {"field": "spec.selectors", "message": msg} if {
	not _kubevirt_admission
	own := _normalised_selectors(_policy)
	some other in input.policies
	is_object(other)
	other.metadata.name != _name
	_normalised_selectors(other) == own
	msg := sprintf("same selectors as MigrationPolicy %q; two policies may not have exactly the same selectors", [other.metadata.name])
}

# A policy's selectors as label requirements, so both shapes and absent or empty selectors
# compare alike; undefined when either selector is malformed, and for a policy without
# spec.selectors: it matches no VMI, so it makes no precedence ambiguous.
_normalised_selectors(doc) := {
	"virtualMachineInstanceSelector": _requirements(doc, "virtualMachineInstanceSelector"),
	"namespaceSelector": _requirements(doc, "namespaceSelector"),
} if {
	object.get(doc, ["spec", "selectors"], null) != null
}

# METADATA
# description: |
#   Per policy of input.policies, in order: the key the same-selectors check compares (a
#   string), or null when that check can never find the policy the same as another (no
#   spec.selectors, a malformed selector, not an object, or the check is off). Two policies can
#   only be duplicates when their keys are equal, so the engine computes the keys of the
#   existing policies once and passes `decision` only the policies that share the admitted
#   one's key: each admission stays O(1) Rego work however many policies exist.
# entrypoint: true
selector_keys := [_selector_key(doc) | some doc in input.policies]

_selector_key(doc) := json.marshal(key) if {
	not _kubevirt_admission
	is_object(doc)
	key := _normalised_selectors(doc)
} else := null

_requirements(doc, field) := policy.selector_requirements(object.get(doc, ["spec", "selectors", field], null))

_kubevirt_admission if policy.settings.precedence == "kubevirt"

# Helpers ---------------------------------------------------------------------------------------

_has_key(obj, key) if {
	is_object(obj)
	key in object.keys(obj)
}

# A value with its JSON type, for messages: `boolean true`, `string "yes"`, `null`.
_shown(null) := "null"

_shown(value) := sprintf("%s %s", [type_name(value), json.marshal(value)]) if value != null
