# VirtualMachinePool selection: the order in which scale-in and updates take a pool's VMs
# (spec.scaleInStrategy and spec.updateStrategy's selectionPolicy). The input is described in
# pool.rego.
package virtrules.pool

_prefer := object.get(_settings, ["random", "prefer"], [])

_states := {"stopped": _stopped, "notReady": _names - _ready, "ready": _ready}

# The VMs in each preferred state, in the order of preference.
_preferred := [object.get(_states, state, set()) | some state in _prefer]

# The VMs of each tier under the Random base policy, the most preferred first: those in the
# first preferred state, those in the second and not the first, ..., then those in none.
_tiers := array.concat(
	[tier |
		some i, state in _preferred
		tier := state - union({earlier | some j, earlier in _preferred; j < i})
	],
	[_names - union({state | some state in _preferred})],
)

# METADATA
# description: |
#   The stable pseudo-random rank of a VM of this pool: from the pool's UID and the VM's name
#   only, so every pass and every replica of the controller agrees.
random_rank(name) := crypto.sha256(concat("/", [_uid, name]))

_epoch := "1970-01-01T00:00:00Z"

# The sort keys of names under a base policy, each [k0, k1, k2, name]. Creation times have a
# resolution of one second: within one, the VM's number tells the order the pool made them in.
# Only the keys of the policy in use are computed, and only for the VMs being ordered.
_base_keys("Oldest", names) := [[0, created, object.get(_ordinals, name, 0), name] |
	some name in names
	created := time.parse_rfc3339_ns(object.get(_alive[name].metadata, "creationTimestamp", _epoch))
]

_base_keys("Newest", names) := [[0, 0 - created, 0 - object.get(_ordinals, name, 0), name] |
	some name in names
	created := time.parse_rfc3339_ns(object.get(_alive[name].metadata, "creationTimestamp", _epoch))
]

# (random_rank inline: a function call per VM costs an evaluation of its own.)
_base_keys("Random", names) := [[tier, crypto.sha256(concat("/", [uid, name])), 0, name] |
	uid := _uid # regal ignore:pointless-reassignment
	some tier, tier_names in _tiers
	some name in (names & tier_names)
]

_base_keys("AscendingOrder", names) := [[0, object.get(_ordinals, name, 0), 0, name] | some name in names]

_base_keys("DescendingOrder", names) := [[0, 0 - object.get(_ordinals, name, 0), 0, name] | some name in names]

# The index of the first ordered policy whose label selector matches labels; count(ordered)
# when none does.
_group(ordered, labels) := min(array.concat(
	[i | some i, p in ordered; selector_matches(object.get(p, "labelSelector", null), labels)],
	[count(ordered)],
))

_labels(obj) := object.get(obj, ["metadata", "labels"], {})

# KubeVirt matches its selectors against the labels of the VM's VMI template.
_selector_labels(vm) := object.get(vm, ["spec", "template", "metadata", "labels"], {})

# METADATA
# description: |
#   The names a selectionPolicy lets scale-in or updates take: all of them, except with
#   KubeVirt's semantics and ordered policies, where only VMs whose VMI template labels match
#   one of the ordered label selectors may be taken.
selectable(names, policy) := names if {
	not _filters(policy)
} else := {name |
	some name in names
	_selects(policy, _selector_labels(_alive[name]))
}

# Whether policy's ordered label selectors let a VM whose VMI template has labels be taken.
_selects(policy, _) if not _filters(policy)

_selects(policy, labels) if {
	_filters(policy)
	some p in policy.orderedPolicies
	selector_matches(object.get(p, "labelSelector", null), labels)
}

_filters(policy) if {
	_kubevirt
	count(object.get(policy, "orderedPolicies", [])) > 0
}

# METADATA
# description: |
#   names ordered as policy (a selectionPolicy) picks them: those matching the first ordered
#   label selector first, then the second, ..., then the rest (with KubeVirt's semantics the
#   selectors filter, see selectable, and do not order); within each group by the base
#   policy (Oldest, Newest: creation time, then number; AscendingOrder, DescendingOrder: the
#   VM's number; Random: preferred states, then random_rank). The name breaks ties. An unknown
#   base policy orders none.
selection_order(names, policy) := [key[last] | last := count(keys[0]) - 1; some key in sort(keys)] if {
	base := _base_keys(object.get(policy, "basePolicy", "Random"), names)
	keys := _grouped(base, object.get(policy, "orderedPolicies", []))
} else := []

# Base keys prefixed with the ordered policy each VM matches first, when ordered policies order
# (with KubeVirt's semantics they filter instead, see selectable).
_grouped(keys, ordered) := keys if {
	count(ordered) == 0
} else := keys if {
	_kubevirt
} else := [array.concat([_group(ordered, _labels(_alive[key[3]]))], key) | some key in keys]

# METADATA
# description: Whether a metav1.LabelSelector matches labels; null matches nothing.
selector_matches(selector, labels) if {
	is_object(selector)
	every key, value in object.get(selector, "matchLabels", {}) {
		labels[key] == value
	}
	every expression in object.get(selector, "matchExpressions", []) {
		_expression_matches(expression, labels)
	}
}

_expression_matches(e, labels) if {
	e.operator == "In"
	labels[e.key] in e.values
}

_expression_matches(e, labels) if {
	e.operator == "NotIn"
	not object.get(labels, e.key, null) in e.values
}

_expression_matches(e, labels) if {
	e.operator == "Exists"
	e.key in object.keys(labels)
}

_expression_matches(e, labels) if {
	e.operator == "DoesNotExist"
	not e.key in object.keys(labels)
}
