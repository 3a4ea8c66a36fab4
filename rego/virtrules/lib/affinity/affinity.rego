# METADATA
# title: Node affinity arithmetic
# description: |
#   Helpers shared by the decisions that shape where a pod may run (migration targets, first
#   scheduling of host-model VMIs). Kubernetes ORs the required node selector terms and ANDs
#   the requirements inside each term; these helpers keep that grammar.
package virtrules.lib.affinity

# METADATA
# description: |
#   node_affinity (a core/v1 NodeAffinity, or null) with term ANDed into its required part,
#   the pure AND of design 001: when there is no required term, term becomes the only one;
#   otherwise every required term gets term's matchExpressions and matchFields appended.
#   Preferred terms are kept untouched.
with_required_term(node_affinity, term) := object.union(_object(node_affinity), {
	"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": _and_all(required_terms(node_affinity), term)},
})

# METADATA
# description: node_affinity (or null) with a weighted preferred term appended.
with_preferred_term(node_affinity, weight, term) := object.union(_object(node_affinity), {
	"preferredDuringSchedulingIgnoredDuringExecution": array.concat(
		_preferred_terms(node_affinity),
		[{"weight": weight, "preference": _compact(term)}],
	),
})

# METADATA
# description: The required node selector terms of node_affinity (or null); [] when none.
required_terms(node_affinity) := terms if {
	terms := node_affinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
	is_array(terms)
} else := []

_preferred_terms(node_affinity) := terms if {
	terms := node_affinity.preferredDuringSchedulingIgnoredDuringExecution
	is_array(terms)
} else := []

_object(x) := x if is_object(x)

_object(x) := {} if not is_object(x)

_and_all(terms, term) := [_compact(term)] if count(terms) == 0

_and_all(terms, term) := [_and(t, term) | some t in terms] if count(terms) > 0

_and(t, term) := _compact(object.union(t, {field: array.concat(_list(t, field), _list(term, field)) |
	some field in _fields
}))

_fields := ["matchExpressions", "matchFields"]

_list(term, field) := list if {
	list := term[field]
	is_array(list)
} else := []

# _compact drops empty requirement lists, as the API server would store the term.
_compact(term) := {k: v |
	some k, v in term
	not _empty_list(v)
}

_empty_list(v) if v == []
