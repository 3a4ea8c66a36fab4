# Node selector terms of migration targets (package documentation in target.rego):
#   the constraint a VirtualMachineInstanceMigration adds, read from its three sources,
#   checked as the API server checks a node selector term, and matched against nodes with the
#   scheduler's semantics. The VMI's own required node affinity terms use the same grammar.
package virtrules.migration.target

_annotation := "migrations.virt-rules.io/added-node-selector-term"

_annotation_path := sprintf("metadata.annotations[%s]", [_annotation])

_annotation_text := object.get(_migration, ["metadata", "annotations", _annotation], null)

_selector := object.get(_migration, ["spec", "addedNodeSelector"], null)

# The terms the migration gives, as [path, value], in the order spec field, annotation.
_given_terms := array.concat(
	[["spec.addedNodeSelectorTerm", value] | value := _migration.spec.addedNodeSelectorTerm; value != null],
	[[_annotation_path, json.unmarshal(_annotation_text)] | is_string(_annotation_text); json.is_valid(_annotation_text)],
)

# A term is a NodeSelectorTerm or, as design 001's YAML shows it, a list of exactly one.
_shaped(path, value) := [[path, value]] if {
	is_object(value)
} else := [[sprintf("%s[0]", [path]), value[0]]] if {
	is_array(value)
	count(value) == 1
} else := []

_term_sources := [{"origin": "term", "path": path, "term": term} |
	some [given_path, value] in _given_terms
	some [path, term] in _shaped(given_path, value)
]

_selector_requirements := [_requirement("selector", sprintf("spec.addedNodeSelector[%s]", [key]), false, raw) |
	some key, value in _object(_selector)
	raw := {"key": key, "operator": "In", "values": [value]}
]

# Whether the migration adds any constraint. A term without requirements ({}, or empty lists)
# and an empty addedNodeSelector add none: design 001's AddedNodeSelectorTerm "is empty by
# default (all Nodes match)", and its merge appends nothing to the VMI's terms for one.
_constrained if count(added_requirements) > 0

# METADATA
# description: |
#   Every requirement the migration adds, normalized (see requirements_of): those of
#   spec.addedNodeSelectorTerm, of the annotation, then one In requirement per addedNodeSelector
#   entry. A node must meet all of them; with none (say an empty term), every node does.
added_requirements := array.concat(
	[req | some source in _term_sources; some req in requirements_of(source)],
	_selector_requirements,
)

# METADATA
# description: The added requirements as one NodeSelectorTerm, as given, to AND into the VMI's terms.
added_term := {
	"matchExpressions": [req.raw | some req in added_requirements; not req.field],
	"matchFields": [req.raw | some req in added_requirements; req.field],
}

# METADATA
# description: |
#   The requirements of a term source {origin, path, term}, each as {origin, path, field (true
#   for matchFields), raw (as given), key, operator, values (a set), bound (Gt/Lt's integer)}.
requirements_of(source) := array.concat(
	[_requirement(source.origin, sprintf("%s.matchExpressions[%d]", [source.path, i]), false, raw) |
		some i, raw in _list(source.term, "matchExpressions")
	],
	[_requirement(source.origin, sprintf("%s.matchFields[%d]", [source.path, i]), true, raw) |
		some i, raw in _list(source.term, "matchFields")
	],
)

_list(term, field) := list if {
	list := term[field]
	is_array(list)
} else := []

_requirement(origin, path, field, raw) := {
	"origin": origin,
	"path": path,
	"field": field,
	"raw": raw,
	"key": _str(req, "key"),
	"operator": _str(req, "operator"),
	"values": {value | some value in _values(req)},
	"bound": _bound(req),
} if {
	req := _object(raw)
}

_values(req) := _array(object.get(req, "values", null))

_bound(req) := n if {
	[value] := req.values
	n := _integer(value)
} else := null

# A label value read as Kubernetes reads it for Gt and Lt (strconv.ParseInt, base 10, 64 bits).
_integer(value) := n if {
	is_string(value)
	[[_, sign, digits]] := regex.find_all_string_submatch_n(`^([+-]?)0*([0-9]+)$`, value, 1)
	n := _signed(sign, to_number(digits))
	n >= -9223372036854775808
	n <= 9223372036854775807
}

_signed("-", magnitude) := 0 - magnitude

_signed(sign, magnitude) := magnitude if sign != "-"

# METADATA
# scope: document
# description: |
#   Whether a node meets a normalized requirement: matchFields compare metadata.name, the rest
#   the node's label. NotIn and DoesNotExist hold for a node without the label; Gt and Lt need a
#   label that reads as an integer.
requirement_matches(req, node) if {
	req.field
	_holds(req.operator, req, node.metadata.name)
}

requirement_matches(req, node) if {
	not req.field
	_holds(req.operator, req, object.get(_labels(node), req.key, null))
}

_holds("In", req, value) if value in req.values

_holds("NotIn", req, value) if not value in req.values

_holds("Exists", _, value) if value != null

_holds("DoesNotExist", _, null)

_holds("Gt", req, value) if _integer(value) > req.bound

_holds("Lt", req, value) if _integer(value) < req.bound

# Validation -------------------------------------------------------------------------------------

_operators := {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}

_field_operators := {"In", "NotIn"}

_shown(value) := json.marshal(value)

# METADATA
# scope: document
# description: What is wrong with the added constraint, each naming its field path.
term_errors contains msg if {
	some ["term", msg] in _problems
}

term_errors contains sprintf("%s: must be a NodeSelectorTerm object (or a list of exactly one), got %s", [path, _shown(value)]) if {
	some [path, value] in _given_terms
	count(_shaped(path, value)) == 0
}

term_errors contains sprintf("%s: must be a string, got %s", [_annotation_path, _shown(_annotation_text)]) if {
	_annotation_text != null
	not is_string(_annotation_text)
}

term_errors contains sprintf("%s: invalid JSON: %s", [_annotation_path, _annotation_text]) if {
	is_string(_annotation_text)
	not json.is_valid(_annotation_text)
}

term_errors contains sprintf("spec.addedNodeSelector: must be a map of label to value, got %s", [_shown(_selector)]) if {
	_selector != null
	not is_object(_selector)
}

term_errors contains sprintf("spec.addedNodeSelector: invalid label key %s", [_shown(key)]) if {
	some key, _ in _object(_selector)
	not _label_key(key)
}

term_errors contains sprintf("spec.addedNodeSelector[%s]: must be a string, got %s", [key, _shown(value)]) if {
	some key, value in _object(_selector)
	not is_string(value)
}

# Problems of terms and requirements, as [origin, message]: the added term's go to term_errors,
# the VMI's to input_errors.
_checked_sources := array.concat(_term_sources, _vmi_term_sources)

_checked_requirements := [req |
	some req in array.concat(added_requirements, [req | some reqs in _vmi_affinity_terms; some req in reqs])
	req.origin != "selector"
]

_problems contains [source.origin, sprintf("%s: must be a NodeSelectorTerm object, got %s", [source.path, _shown(source.term)])] if {
	some source in _checked_sources
	not is_object(source.term)
}

_problems contains [source.origin, sprintf("%s: unknown field %s", [source.path, _shown(field)])] if {
	some source in _checked_sources
	some field, _ in _object(source.term)
	not field in {"matchExpressions", "matchFields"}
}

_problems contains [source.origin, sprintf("%s.%s: must be a list, got %s", [source.path, field, _shown(value)])] if {
	some source in _checked_sources
	some field in ["matchExpressions", "matchFields"]
	value := object.get(_object(source.term), field, null)
	value != null
	not is_array(value)
}

_problems contains [req.origin, sprintf("%s: must be a NodeSelectorRequirement object, got %s", [req.path, _shown(req.raw)])] if {
	some req in _checked_requirements
	not is_object(req.raw)
}

_problems contains [req.origin, sprintf("%s: unknown field %s", [req.path, _shown(field)])] if {
	some req in _checked_requirements
	some field, _ in _object(req.raw)
	not field in {"key", "operator", "values"}
}

_problems contains [req.origin, sprintf("%s.key: invalid label key %s", [req.path, _shown(key)])] if {
	some req in _checked_requirements
	is_object(req.raw)
	not req.field
	key := object.get(req.raw, "key", null)
	not _label_key(key)
}

_problems contains [req.origin, sprintf("%s.key: matchFields supports only metadata.name, got %s", [req.path, _shown(key)])] if {
	some req in _checked_requirements
	is_object(req.raw)
	req.field
	key := object.get(req.raw, "key", null)
	key != "metadata.name"
}

_problems contains [req.origin, sprintf("%s.operator: unknown operator %s", [req.path, _shown(operator)])] if {
	some req in _checked_requirements
	is_object(req.raw)
	operator := object.get(req.raw, "operator", null)
	not operator in _operators
}

_problems contains [req.origin, sprintf("%s.operator: matchFields supports only In and NotIn, got %s", [req.path, _shown(req.operator)])] if {
	some req in _checked_requirements
	req.field
	req.operator in _operators
	not req.operator in _field_operators
}

_problems contains [req.origin, sprintf("%s.values: must be a list of strings, got %s", [req.path, _shown(values)])] if {
	some req in _checked_requirements
	values := object.get(_object(req.raw), "values", null)
	values != null
	not is_array(values)
}

_problems contains [req.origin, sprintf("%s.values[%d]: must be a string, got %s", [req.path, i, _shown(value)])] if {
	some req in _checked_requirements
	some i, value in _values(_object(req.raw))
	not is_string(value)
}

_problems contains [req.origin, sprintf("%s.values: operator %s needs %s, got %d", [req.path, req.operator, wanted, got])] if {
	some req in _checked_requirements
	wanted := _arity(req.field, req.operator)
	got := count(_values(_object(req.raw)))
	not _arity_allows(wanted, got)
}

_problems contains [req.origin, sprintf("%s.values[0]: operator %s needs an integer, got %s", [req.path, req.operator, _shown(value)])] if {
	some req in _checked_requirements
	not req.field
	req.operator in {"Gt", "Lt"}
	[value] := _values(_object(req.raw))
	is_string(value)
	not _integer(value)
}

# How many values an operator takes, as words for the message.
_arity(false, operator) := "at least one value" if operator in {"In", "NotIn"}

_arity(true, operator) := "exactly one node name" if operator in _field_operators

_arity(false, operator) := "no values" if operator in {"Exists", "DoesNotExist"}

_arity(false, operator) := "exactly one value" if operator in {"Gt", "Lt"}

_arity_allows("at least one value", n) if n > 0

_arity_allows("no values", 0)

_arity_allows(wanted, 1) if wanted in {"exactly one node name", "exactly one value"}

# A qualified name as Kubernetes requires of label keys: [DNS subdomain "/"] name.
_label_key(key) if {
	is_string(key)
	[name] := split(key, "/")
	_label_name(name)
}

_label_key(key) if {
	is_string(key)
	[prefix, name] := split(key, "/")
	count(prefix) <= 253
	regex.match(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`, prefix)
	_label_name(name)
}

_label_name(name) if {
	count(name) <= 63
	regex.match(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`, name)
}
