# METADATA
# title: Host-model migratability level
# description: |
#   How many of the cluster's other schedulable nodes a host-model VM first started on a node
#   could migrate to, in percent (design proposal 002), and the node affinity that makes a
#   host-model VMI's first scheduling prefer or require nodes with a high level.
#
#   A node A can take host-model VMs to a node B (B != A, B schedulable) when B carries
#   cpu-model-migration.node.kubevirt.io/<A's host model> and, for every
#   host-model-required-features.node.kubevirt.io/<f> of A, cpu-feature.node.kubevirt.io/<f>.
#   Level of A = floor(100 * |such B| / |schedulable nodes other than A|), 0 when A is the only
#   schedulable node. Only schedulable nodes with a host model get a level.
#
#   Nodes are never compared pairwise. Each node reduces to its CPU signature (`signature`);
#   nodes with equal signatures are interchangeable, so levels are computed per distinct
#   signature (`levels`) and multiplied by member counts. Per node the work is one builtin
#   removal of its non-CPU labels and a hash lookup; the comparisons number distinct
#   (host model, required features) sources times distinct signatures, independent of the
#   number of nodes.
#
#   Entrypoints:
#     signature:            input {node}           -> the node's CPU signature
#     signatures:           input {nodes}          -> {id: signature} for an object of nodes
#     levels:               input {groups, reach?} -> level per signature group
#     reach:                input {groups}         -> the count-free part of `levels`
#     decision:             input {nodes}          -> {levels: {node name: level}}
#     scheduling_affinity:  input {vmi, kubevirt}  -> node affinity for a first scheduling
package virtrules.node.migratability

import data.virtrules.lib.affinity

# Node labels -------------------------------------------------------------------------------------

# Node label prefixes (the part before "/") and the signature field each one fills.
_label_kinds := {
	"host-model-cpu.node.kubevirt.io": "hostModel",
	"host-model-required-features.node.kubevirt.io": "requiredFeatures",
	"cpu-model-migration.node.kubevirt.io": "models",
	"cpu-feature.node.kubevirt.io": "features",
}

# METADATA
# description: The node label the Go controller writes each node's level to.
level_label := "kubevirt/host-model-migratability-level"

_labels(node) := labels if {
	labels := node.metadata.labels
	is_object(labels)
} else := {}

_schedulable_label := "kubevirt.io/schedulable"

# METADATA
# description: |
#   Every node label a signature reads starts with one of these prefixes. The engine hands
#   `signature` only a node's labels under them (and spec.unschedulable), and treats nodes
#   whose labels under them are equal as one group, so it converts and asks once per group.
signature_label_prefixes := array.concat(
	sort([concat("", [prefix, "/"]) | some prefix, _ in _label_kinds]),
	[_schedulable_label],
)

# _other_keys keeps, of a set of label keys, those a CPU signature does not depend on.
_other_keys(keys) := keys - {key | some key in keys; _cpu_key(key)}

# _cpu_key: the signature depends on the label key.
_cpu_key(key) if {
	[prefix, _] := split(key, "/")
	_label_kinds[prefix]
}

_cpu_key("kubevirt.io/schedulable")

# _cpu_facts is what a node's signature depends on: [cordoned, its CPU labels]. other_keys must
# hold every label key of the node that is not a CPU label key, and may hold more (those of the
# whole cluster); removing them is a builtin's work. Nodes with equal facts have equal
# signatures, so facts serve as group keys.
_cpu_facts(node, other_keys) := [
	object.get(node, ["spec", "unschedulable"], false) == true,
	object.remove(_labels(node), other_keys),
]

# The prefix, up to and including its "/", of each signature field's labels.
_field_prefixes[kind] := concat("", [prefix, "/"]) if some prefix, kind in _label_kinds

# _true_keys lists the keys of the labels set to "true" (any other value, "false" included,
# counts as absent).
_true_keys(labels) := [key | some key, "true" in labels]

# _names lists, sorted, the names of the labels of one signature field among keys: what follows
# the field's prefix, when not empty and without a further "/". A pass of builtins per field
# costs less than splitting every key.
_names(keys, kind) := sort([name |
	some key in keys
	startswith(key, prefix)
	name := substring(key, length, -1)
	name != ""
	not contains(name, "/")
]) if {
	prefix := _field_prefixes[kind]
	length := count(prefix)
}

_schedulable(cordoned, labels) := false if {
	cordoned == true
} else := false if {
	labels[_schedulable_label] == "false"
} else := true

# A node carries one host model; several host-model-cpu labels are ambiguous and give none.
_host_model(keys) := models[0] if {
	models := _names(keys, "hostModel")
	count(models) == 1
} else := null

# Signatures --------------------------------------------------------------------------------------

# METADATA
# description: |
#   The CPU signature of input.node (a core/v1 Node as stored): everything about it that
#   migratability depends on, in canonical form so equal signatures mean interchangeable nodes:
#     schedulable:      false when spec.unschedulable is true or kubevirt.io/schedulable is "false"
#     hostModel:        the model of its host-model-cpu label, null when none or several
#     requiredFeatures: sorted names of its host-model-required-features labels
#     models:           sorted names of its cpu-model-migration labels
#     features:         sorted names of its cpu-feature labels
#   Only labels set to "true" count. Undefined when input.node is not an object.
# entrypoint: true
signature := _node_signature(input.node) if {
	is_object(input.node)
}

# METADATA
# description: |
#   The CPU signature (see `signature`) of every node of input.nodes, an object of nodes by
#   opaque id: {id: signature}. Entries that are not objects get none. Lets the engine ask for
#   the signatures of all the groups it has not seen yet in one evaluation. Undefined when
#   input.nodes is not an object.
# entrypoint: true
signatures := {id: _node_signature(node) | some id, node in input.nodes; is_object(node)} if {
	is_object(input.nodes)
}

# A node's signature reads its labels as they are: _signature_of ignores every label that is not
# a CPU label, so removing them first (as _cpu_facts does for grouping) would only cost time.
_node_signature(node) := _signature_of([object.get(node, ["spec", "unschedulable"], false) == true, _labels(node)])

# _signature_of turns a node's facts (see _cpu_facts; labels that are not CPU labels may stay)
# into its signature.
_signature_of(facts) := {
	"schedulable": _schedulable(cordoned, labels),
	"hostModel": _host_model(keys),
	"requiredFeatures": _names(keys, "requiredFeatures"),
	"models": _names(keys, "models"),
	"features": _names(keys, "features"),
} if {
	[cordoned, labels] := facts
	keys := _true_keys(labels)
}

# Levels per signature group ----------------------------------------------------------------------

# METADATA
# description: |
#   The level of every signature group: input.groups maps an opaque group id to
#   {signature: <a value of `signature`>, count: <number of nodes with that signature>}.
#   Returns {id: level} for each group whose signature is schedulable, has a host model and
#   has at least one member. Ids may repeat a signature (their members add up). Cost grows with
#   the number of groups, not nodes, so the engine keeps member counts per signature and asks
#   again after a node is added, removed or relabelled. Undefined when input.groups is not an
#   object or a group is malformed (count not a non-negative integer, signature not of the
#   shape `signature` returns: its lists hold distinct strings).
#   With input.reach (the value of `reach` for the same group ids and signatures) the
#   comparisons are not made again: a count changing costs sums over the listed groups. A
#   reach for other ids than input.groups' is not used.
# entrypoint: true
levels := _indexed_levels(input.reach, input.groups) if {
	is_object(input.groups)
	is_object(input.reach)
} else := _group_levels(input.groups) if {
	is_object(input.groups)
}

# METADATA
# description: |
#   What `levels` needs of signature groups that does not depend on their member counts: every
#   comparison of a source (host model and required features) with a group. input.groups maps
#   a group id to {signature} as for `levels` (a count is not read). Returns
#   {"groups": {id: {"schedulable": bool, "source": i, "self": 0 or 1}},
#   "sources": [[ids of the schedulable groups source i reaches], ...]}, source -1 for a group
#   without a host model. Plain JSON, so the engine can keep it while only counts change (a
#   node joining or leaving a group) and pass it back to `levels` as input.reach. Undefined when
#   input.groups is not an object or a signature is malformed.
# entrypoint: true
reach := {
	"groups": {id: {"schedulable": group.schedulable, "source": _source_index(indices, group), "self": _self(group)} |
		some id, group in prepared
	},
	"sources": [[id | some id, target in prepared; target.schedulable; _reaches(source, target)] | some source in sources],
} if {
	is_object(input.groups)
	prepared := {id: p | some id, group in input.groups; p := _prepare_signature(group.signature)}
	count(prepared) == count(input.groups)
	sources := sort({group.source | some group in prepared; group.schedulable; group.source.hostModel != null})
	indices := {source: i | some i, source in sources}
}

# _source_index is the position of a schedulable group's source in sources, -1 for a group
# that gets no level (unschedulable, or without a host model).
_source_index(indices, group) := i if {
	group.schedulable
	i := indices[group.source]
} else := -1

# _indexed_levels is _group_levels(groups) from the comparisons `reach` made for their ids;
# undefined when reach is not for those ids or a count is malformed.
_indexed_levels(reach, groups) := {id: _level(reached[group.source] - group.self, total) |
	some id, group in reach.groups
	group.source >= 0
	groups[id].count > 0
} if {
	object.keys(reach.groups) == object.keys(groups)
	every group in groups {
		_count(group.count)
	}
	total := sum([groups[id].count | some id, group in reach.groups; group.schedulable])
	reached := [sum([groups[id].count | some id in ids]) | some ids in reach.sources]
}

# _group_levels is the level of each group of a groups object (see `levels`), undefined when a
# group is malformed: the one computation both `levels` and `decision` use.
_group_levels(groups) := {id: _level(reach[group.source] - _self(group), total) |
	some id, group in prepared
	group.source.hostModel != null
	group.count > 0
} if {
	# Checking a group's shape and turning its lists into sets is one pass over its lists.
	prepared_groups := {id: p | some id, group in groups; p := _prepare(group)}
	count(prepared_groups) == count(groups)
	prepared := {id: group | some id, group in prepared_groups; group.schedulable}
	total := sum([group.count | some group in prepared])

	# Where a VM may go depends only on the host model and required features of its first node,
	# which far fewer groups differ in: count the destinations once per such source.
	sources := {group.source | some group in prepared; group.source.hostModel != null}
	reach := {source: sum([target.count | some target in prepared; _reaches(source, target)]) |
		some source in sources
	}
}

# _prepare turns a well-formed group's lists into sets, for the comparisons; undefined for a
# malformed group.
_prepare(group) := object.union(_prepare_signature(group.signature), {"count": group.count}) if {
	_count(group.count)
}

_prepare_signature(signature) := {
	"schedulable": signature.schedulable,
	"source": {
		"hostModel": signature.hostModel,
		"required": _string_set(signature.requiredFeatures),
	},
	"models": _string_set(signature.models),
	"features": _string_set(signature.features),
} if {
	is_boolean(signature.schedulable)
	_string_or_null(signature.hostModel)
}

_count(x) if {
	is_number(x)
	x == floor(x)
	x >= 0
}

_string_or_null(x) if is_string(x)

_string_or_null(null)

# _string_set is the set of a list of distinct strings (what `signature` returns), undefined
# for anything else.
_string_set(list) := set if {
	is_array(list)
	set := {item | some item in list}
	count(set) == count(list)
	_only_strings(set)
}

# Strings sort after null, booleans and numbers and before arrays, objects and sets: a set holds
# only strings when its least and greatest members are strings, two builtin calls instead of
# one per member.
_only_strings(set) if count(set) == 0

_only_strings(set) if {
	is_string(min(set))
	is_string(max(set))
}

# _reaches: a host-model VM started on a node of source can run on a node of target.
_reaches(source, target) if {
	source.hostModel in target.models
	count(source.required - target.features) == 0
}

# _self is 1 when a group's members are destinations for its own VMs: a node never counts
# itself.
_self(group) := 1 if {
	_reaches(group.source, group)
} else := 0

# _level of a node that reaches reachable of the total schedulable nodes, itself included.
_level(_, total) := 0 if total <= 1

_level(reachable, total) := floor((100 * reachable) / (total - 1)) if total > 1

# Levels of a node list -----------------------------------------------------------------------------

_nodes := [node | some node in input.nodes; is_object(node)]

# The label keys of the whole cluster that are not CPU label keys, classified once.
_cluster_other_keys := _other_keys(union({object.keys(_labels(node)) | some node in _nodes}))

_node_facts := [_cpu_facts(node, _cluster_other_keys) | some node in _nodes]

_distinct_facts := {facts | some facts in _node_facts}

# The node list's groups, keyed by their facts; OPA indexes the inner comprehension, so counting
# the members of every group is one pass over the nodes.
_node_groups[facts] := {"signature": _signature_of(facts), "count": count([1 | some f in _node_facts; f == facts])} if {
	some facts in _distinct_facts
}

_node_group_levels := _group_levels(_node_groups)

# METADATA
# description: |
#   The level of every schedulable node with a host model in input.nodes (core/v1 Nodes as
#   stored, with distinct names), as {levels: {node name: level}}. Computed with the rules of
#   `signature` and `levels`, grouping the nodes by what their signature depends on, so it
#   always agrees with them. Entries that are not objects are ignored; nodes without a name
#   count but get no entry.
# entrypoint: true
decision := {"levels": {name: level |
	some i, facts in _node_facts
	level := _node_group_levels[facts]
	name := _nodes[i].metadata.name
	is_string(name)
}}

# First scheduling of host-model VMIs --------------------------------------------------------------

_migrations_path := "spec.configuration.migrations"

_migrations := migrations if {
	migrations := input.kubevirt.spec.configuration.migrations
	is_object(migrations)
} else := {}

# KubeVirt's CRD has no field for the design's knobs: the API server drops them. On a cluster
# they live in these annotations of the KubeVirt CR; the fields are still read (offline).
require_annotation := "migrations.virt-rules.io/require-host-model-migratability-level"

prefer_annotation := "migrations.virt-rules.io/preferred-host-model-migratability-level"

_annotations := annotations if {
	annotations := input.kubevirt.metadata.annotations
	is_object(annotations)
} else := {}

_annotation_path(name) := sprintf("metadata.annotations[%q]", [name])

# An annotation's value: a number when it is one, otherwise the string (reported as invalid).
_annotation_number(raw) := to_number(raw) if regex.match(`^-?[0-9]+(\.[0-9]+)?$`, raw)

else := raw

# An annotation's value: the object when it is JSON, otherwise the string (reported as invalid).
_annotation_object(raw) := json.unmarshal(raw) if json.is_valid(raw)

else := raw

# Where the required level is set (a path) and to what.
_required_settings[path] := value if {
	value := object.get(_migrations, "requireHostModelMigratabilityLevel", null)
	value != null
	path := concat(".", [_migrations_path, "requireHostModelMigratabilityLevel"])
}

_required_settings[path] := _annotation_number(raw) if {
	raw := _annotations[require_annotation]
	path := _annotation_path(require_annotation)
}

_required_level := [value | some value in _required_settings][0]

# The design spells the field "prefered"; the correct spelling is accepted as well.
_preferred_fields := ["preferedHostModelMigratabilityLevel", "preferredHostModelMigratabilityLevel"]

_preferred_settings[path] := value if {
	some field in _preferred_fields
	value := object.get(_migrations, field, null)
	value != null
	path := concat(".", [_migrations_path, field])
}

_preferred_settings[path] := _annotation_object(raw) if {
	raw := _annotations[prefer_annotation]
	path := _annotation_path(prefer_annotation)
}

_preferred := [value | some value in _preferred_settings][0]

_preferred_level := object.get(_preferred, "level", null)

_preferred_weight := object.get(_preferred, "weight", null)

_integer_in(x, low, high) if {
	is_number(x)
	x == floor(x)
	x >= low
	x <= high
}

# Two places setting one knob to different values: the first (in sorted order) is named as the
# one it conflicts with.
_conflicts(settings) := msg if {
	count({value | some value in settings}) > 1
	paths := sort(object.keys(settings))
	msg := sprintf("%s: conflicts with %s; set only one", [paths[1], paths[0]])
}

_knob_errors contains _conflicts(_required_settings)

_knob_errors contains _conflicts(_preferred_settings)

_knob_errors contains msg if {
	some path, value in _required_settings
	not _integer_in(value, 0, 100)
	msg := sprintf("%s: must be an integer from 0 to 100, got %v", [path, value])
}

_knob_errors contains msg if {
	some path, value in _preferred_settings
	not is_object(value)
	msg := sprintf("%s: must be an object with level and weight, got %v", [path, value])
}

_knob_errors contains msg if {
	some path, value in _preferred_settings
	is_object(value)
	level := object.get(value, "level", null)
	not _integer_in(level, 0, 100)
	msg := sprintf("%s.level: must be an integer from 0 to 100, got %v", [path, level])
}

_knob_errors contains msg if {
	some path, value in _preferred_settings
	is_object(value)
	weight := object.get(value, "weight", null)
	weight != null
	not _integer_in(weight, 1, 100)
	msg := sprintf("%s.weight: must be an integer from 1 to 100, got %v", [path, weight])
}

_vmi_cpu_model := model if {
	model := input.vmi.spec.domain.cpu.model
	is_string(model)
	model != ""
} else := model if {
	# An unset model falls back to the cluster's default CPU model, then to host-model.
	model := input.kubevirt.spec.configuration.cpuModel
	is_string(model)
	model != ""
} else := "host-model"

_scheduled if {
	node := input.vmi.status.nodeName
	is_string(node)
	node != ""
}

_first_host_model_scheduling if {
	is_object(input.vmi)
	_vmi_cpu_model == "host-model"
	not _scheduled
}

_has_knob if count(_required_settings) > 0

_has_knob if count(_preferred_settings) > 0

# A node selector term that requires a level of at least level.
_level_term(level) := {"matchExpressions": [{
	"key": level_label,
	"operator": "Gt",
	"values": [format_int(level - 1, 10)],
}]}

_vmi_node_affinity := node_affinity if {
	node_affinity := input.vmi.spec.affinity.nodeAffinity
	is_object(node_affinity)
} else := null

_with_required(node_affinity) := affinity.with_required_term(node_affinity, _level_term(_required_level)) if {
	count(_required_settings) > 0
} else := node_affinity

_with_preferred(node_affinity) := affinity.with_preferred_term(node_affinity, _weight, _level_term(_preferred_level)) if {
	count(_preferred_settings) > 0
} else := node_affinity

# The lowest weight unless the knob sets one.
_weight := floor(_preferred_weight) if {
	_preferred_weight != null
} else := 1

# METADATA
# description: |
#   The node affinity a host-model VMI's launcher pod should have at its first scheduling.
#   Input: vmi (the VirtualMachineInstance as stored) and kubevirt (the KubeVirt CR, or null).
#   The VMI is host-model when spec.domain.cpu.model is "host-model", or unset and the CR's
#   spec.configuration.cpuModel is unset or "host-model"; it is at its first scheduling while
#   status.nodeName is unset. The KubeVirt CR's knobs, each set in one place: the annotation
#   (KubeVirt's schema has no field for them, so this is their home on a cluster) or the
#   design's field under spec.configuration.migrations (read for offline use):
#     migrations.virt-rules.io/require-host-model-migratability-level: "N" (0..100), or
#     requireHostModelMigratabilityLevel: N
#       requires kubevirt/host-model-migratability-level > N-1 in every required term
#     migrations.virt-rules.io/preferred-host-model-migratability-level: '{"level": N, "weight": W}',
#     or preferedHostModelMigratabilityLevel (or preferredHostModelMigratabilityLevel):
#         {level: N (0..100), weight: W (1..100, default 1)}
#       adds a preferred term of weight W with the same requirement
#   Returns vmi.spec.affinity.nodeAffinity with those terms added; {error: "<field>: <problem>"}
#   when a knob is invalid; null when the VMI is not host-model, is already scheduled, or no
#   knob is set.
# entrypoint: true
scheduling_affinity := {"error": concat("; ", sort(_knob_errors))} if {
	_first_host_model_scheduling
	count(_knob_errors) > 0
} else := _with_preferred(_with_required(_vmi_node_affinity)) if {
	_first_host_model_scheduling
	_has_knob
} else := null
