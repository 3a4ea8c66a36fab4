# METADATA
# title: CPU baseline
# description: |
#   The guest CPU every schedulable node of a group can run, for a cluster whose nodes differ
#   (design 002's heterogeneous cluster): a named CPU model plus features with KubeVirt's
#   policies, the CPU libvirt's own baseline (virConnectBaselineCPU) gives for those hosts, and
#   what each kind of node costs it.
#
#   What a node runs is read from the labels KubeVirt's node labeller writes: its vendor
#   (cpu-vendor.node.kubevirt.io/<vendor>), the CPU models libvirt says it can run
#   (cpu-model.node.kubevirt.io/<model>) and its host CPU's features
#   (cpu-feature.node.kubevirt.io/<feature>), only labels set to "true". What a model contains
#   is libvirt's cpu_map, data.virtrules.node.baseline.cpu_map, generated from libvirt itself
#   (make cpu-map) and checked up to date by a test.
#
#   For a group (the whole cluster, or the nodes sharing a value of the label
#   settings.groupBy names):
#     features = the features every node of the group has (the intersection of their
#                cpu-feature labels);
#     model    = of the models every node can run, of the group's vendor, the one with the
#                most features in cpu_map (ties: the first by name);
#     require  = features - the model's; disable = the model's - features,
#   so that the guest CPU (model + require - disable) has exactly the group's features, and
#   KubeVirt's launcher node selector (cpu-model.../<model>, cpu-feature.../<required>) matches
#   every node of the group. No model, with a reason, when vendors differ or no model is common.
#
#   Nodes are handled by kind: nodes with equal baseline labels (see label_prefixes) and
#   schedulability are one kind, so the work grows with kinds, not nodes. A tradeoff is the
#   baseline of the group without the nodes of one host model, kept when it gains features.
#
#   Entrypoints:
#     label_prefixes: the node label prefixes a kind reads (the engine groups nodes by them)
#     decision:       input {kinds: [{nodes, unschedulable, labels}], groupBy?} or
#                     input {nodes: [Node]} -> {groups, warnings}
package virtrules.node.baseline

_vendor_prefix := "cpu-vendor.node.kubevirt.io/"

_model_prefix := "cpu-model.node.kubevirt.io/"

_feature_prefix := "cpu-feature.node.kubevirt.io/"

_host_model_prefix := "host-model-cpu.node.kubevirt.io/"

_schedulable_label := "kubevirt.io/schedulable"

# METADATA
# description: |
#   Every node label a kind reads starts with one of these, or is the group label
#   (settings.groupBy, or input.groupBy). The engine hands `decision` only these labels.
# entrypoint: true
label_prefixes := array.concat(_cpu_prefixes, [group_by]) if {
	is_string(group_by)
} else := _cpu_prefixes

_cpu_prefixes := [_feature_prefix, _model_prefix, _vendor_prefix, _host_model_prefix, _schedulable_label]

# METADATA
# description: The label key that splits the nodes into groups; null for one group of all.
group_by := input.groupBy if {
	is_string(input.groupBy)
	input.groupBy != ""
} else := data.virtrules.node.baseline.settings.groupBy

_models := data.virtrules.node.baseline.cpu_map.models.x86_64

# Kinds --------------------------------------------------------------------------------------------

# The kinds of node given: input.kinds as the engine prepares them, or input.nodes grouped here.
_given_kinds := input.kinds if {
	is_array(input.kinds)
} else := [{"nodes": names, "unschedulable": cordoned, "labels": labels} |
	some [cordoned, labels], names in _node_kinds
]

_node_kinds[facts] contains node.metadata.name if {
	some node in input.nodes
	facts := [object.get(node, ["spec", "unschedulable"], false) == true, _kind_labels(object.get(node, ["metadata", "labels"], {}))]
}

_kind_labels(labels) := {key: value |
	some key, value in labels
	_read(key)
}

_read(key) if startswith(key, _cpu_prefixes[_])

_read(key) if key == group_by

# _names: the names after prefix of the labels set to "true".
_names(labels, prefix) := {substring(key, count(prefix), -1) |
	some key, "true" in labels
	startswith(key, prefix)
}

# Each kind as the decision reads it.
_kinds[i] := {
	"nodes": sort(kind.nodes),
	"group": _group_of(kind.labels),
	"schedulable": _schedulable(kind),
	"vendors": _names(kind.labels, _vendor_prefix),
	"models": _names(kind.labels, _model_prefix),
	"features": _names(kind.labels, _feature_prefix),
	"hostModel": concat(",", sort(_names(kind.labels, _host_model_prefix))),
} if some i, kind in _given_kinds

_schedulable(kind) := false if {
	kind.unschedulable == true
} else := false if {
	kind.labels[_schedulable_label] == "false"
} else := true

_group_of(_) := "" if group_by == null

_group_of(labels) := sprintf("%s=%s", [group_by, value]) if {
	group_by != null
	value := labels[group_by]
	is_string(value)
}

_group_of(labels) := sprintf("%s absent", [group_by]) if {
	group_by != null
	not _has_group(labels)
}

_has_group(labels) if is_string(labels[group_by])

# Why a kind is left out, if it is.
_left_out(kind) := ["Unschedulable", "spec.unschedulable is true or kubevirt.io/schedulable is \"false\": no VM is scheduled there"] if {
	not kind.schedulable
} else := ["NoCPULabels", "no cpu-vendor.node.kubevirt.io and cpu-model.node.kubevirt.io labels: KubeVirt's node labeller has not labelled it (virt-handler not running there, or not an amd64 node)"] if {
	_no_cpu_labels(kind)
}

_no_cpu_labels(kind) if count(kind.vendors) == 0

_no_cpu_labels(kind) if count(kind.models) == 0

# The kinds each group's baseline is made of, by group.
_considered[group] contains i if {
	some i, kind in _kinds
	group := kind.group
	not _left_out(kind)
}

# Baseline of a set of kinds ----------------------------------------------------------------------

_node_count(ids) := sum([count(_kinds[i].nodes) | some i in ids])

_vendors(ids) := {vendor | some i in ids; some vendor in _kinds[i].vendors}

_intersection(sets) := intersection(sets) if count(sets) > 0

# _baseline of a non-empty set of kind ids.
_baseline(ids) := _no_cpu(null, "VendorsDiffer", sprintf(
	"the nodes are of %d vendors (%s): no guest CPU runs on all of them",
	[count(vendors), concat(", ", [_vendor_count(ids, v) | some v in sort(vendors)])],
)) if {
	vendors := _vendors(ids)
	count(vendors) > 1
} else := _no_cpu(vendor, "NoCommonModel", _no_model_message(common)) if {
	[vendor] := [v | some v in _vendors(ids)]
	common := _intersection({_kinds[i].models | some i in ids})
	count(_candidates(common, vendor)) == 0
} else := _cpu(vendor, model, _intersection({_kinds[i].features | some i in ids})) if {
	[vendor] := [v | some v in _vendors(ids)]
	model := _best(_candidates(_intersection({_kinds[i].models | some i in ids}), vendor))
}

_no_cpu(vendor, reason, message) := {
	"vendor": vendor, "model": null, "features": [], "guestFeatures": [],
	"reason": reason, "message": message,
}

# The guest CPU of model with exactly features: require what the model lacks, disable what it
# has beyond them.
_cpu(vendor, model, features) := {
	"vendor": vendor,
	"model": model,
	"features": array.concat(
		[{"name": f, "policy": "require"} | some f in sort(features - own)],
		[{"name": f, "policy": "disable"} | some f in sort(own - features)],
	),
	"guestFeatures": sort(features),
	"reason": "",
	"message": "",
} if {
	own := {f | some f in _models[model].features}
}

_vendor_count(ids, vendor) := sprintf("%s: %d", [vendor, _node_count({i | some i in ids; vendor in _kinds[i].vendors})])

_no_model_message(common) := "no CPU model is among every node's cpu-model.node.kubevirt.io labels" if {
	count(common) == 0
} else := sprintf("the models every node runs (%s) are not of the nodes' vendor or not in this bundle's cpu_map (libvirt %s)", [concat(", ", sort(common)), data.virtrules.node.baseline.cpu_map.libvirt])

# Models libvirt's cpu_map knows among names, of vendor or of none.
_candidates(names, vendor) := {name |
	some name in names
	model := _models[name]
	object.get(model, "vendor", vendor) == vendor
}

# The model with the most features; ties go to the first by name.
_best(names) := [name |
	some name in sort(names)
	count(_models[name].features) == most
][0] if {
	most := max([count(_models[name].features) | some name in names])
}

# Decision -----------------------------------------------------------------------------------------

# METADATA
# description: |
#   The baseline of every group: {"groups": [...], "warnings": [...]}, groups sorted by name.
#   Each group: group ("" for all nodes, else "KEY=VALUE" or "KEY absent"), nodes (the names
#   considered), notConsidered (each node of the group left out, with reason Unschedulable or
#   NoCPULabels and a message), vendor, model (null when none), features ([{name, policy}],
#   policy require or disable), guestFeatures (what the guest CPU has), reason and message
#   ("" when there is a model), share (percent of the considered nodes KubeVirt's launcher
#   node selector for the guest CPU selects: 100 by construction), tradeoffs (at most
#   settings.maxTradeoffs: the baseline without the nodes of one host model, most features
#   gained first:
#   nodes, hostModel, vendor, model, gainedFeatures) and snippets (kubevirt: a KubeVirt CR's
#   spec; cpu: a VM's spec.domain.cpu). A group none of whose nodes is considered has reason
#   NoNodes.
# entrypoint: true
decision := {
	"groups": [_group_report(group) | some group in sort({kind.group | some kind in _kinds})],
	"warnings": _warnings,
}

_group_report(group) := object.union(_report_of(group, ids), {
	"group": group,
	"nodes": sort([node | some i in ids; some node in _kinds[i].nodes]),
	"notConsidered": [entry | some [_, entry] in sort([[node, {"node": node, "reason": why[0], "message": why[1]}] |
		some kind in _kinds
		kind.group == group
		why := _left_out(kind)
		some node in kind.nodes
	])],
}) if {
	ids := object.get(_considered, group, set())
}

_report_of(_, ids) := object.union(base, {
	"share": _share(ids, base),
	"tradeoffs": _tradeoffs(ids, base),
	"snippets": _snippets(base),
}) if {
	count(ids) > 0
	base := _baseline(ids)
}

_report_of(group, ids) := {
	"vendor": null, "model": null, "features": [], "guestFeatures": [],
	"reason": "NoNodes",
	"message": sprintf("no node of %s is considered: each is unschedulable or has no CPU labels of KubeVirt's node labeller", [_group_name(group)]),
	"share": 0, "tradeoffs": [], "snippets": {},
} if count(ids) == 0

_group_name("") := "the cluster"

_group_name(group) := sprintf("group %s", [group]) if group != ""

# _share: the percent of the group's nodes KubeVirt's launcher node selector for the guest CPU
# (its model's cpu-model label and each required feature's cpu-feature label) selects.
_share(_, base) := 0 if base.model == null

_share(ids, base) := round((100 * _node_count(_selected(ids, base))) / _node_count(ids)) if base.model != null

_selected(ids, base) := {i |
	some i in ids
	base.model in _kinds[i].models
	required := {f.name | some f in base.features; f.policy == "require"}
	count(required - _kinds[i].features) == 0
}

_tradeoffs(ids, base) := array.slice(
	[entry | some [_, _, entry] in sort([[0 - count(t.gainedFeatures), t.nodes[0], t] | some t in _without_each(ids, base)])],
	0, data.virtrules.node.baseline.settings.maxTradeoffs,
)

# The baseline without the nodes of each host model (host-model-cpu label: the hosts of one CPU
# generation, whatever features microcode or BIOS add or remove on some), where it gains.
_without_each(ids, base) := {{
	"nodes": sort([node | some i in these; some node in _kinds[i].nodes]),
	"hostModel": host_model,
	"vendor": rest.vendor,
	"model": rest.model,
	"gainedFeatures": sort({f | some f in rest.guestFeatures} - {f | some f in base.guestFeatures}),
} |
	some host_model in {_kinds[i].hostModel | some i in ids}
	these := {i | some i in ids; _kinds[i].hostModel == host_model}
	count(ids - these) > 0
	rest := _baseline(ids - these)
	_gains(rest, base)
}

_gains(rest, base) if {
	base.model == null
	rest.model != null
}

_gains(rest, base) if {
	base.model != null
	rest.model != null
	count({f | some f in rest.guestFeatures} - {f | some f in base.guestFeatures}) > 0
}

_snippets(base) := {} if base.model == null

_snippets(base) := {
	"kubevirt": {"spec": {"configuration": {"cpuModel": base.model}}},
	"cpu": _vm_cpu(base),
} if base.model != null

_vm_cpu(base) := {"model": base.model} if {
	base.features == []
} else := {"model": base.model, "features": base.features}

# Warnings ------------------------------------------------------------------------------------------

_warnings := [sprintf("%d node(s) have no label %s and are grouped as %q: %s", [count(names), group_by, sprintf("%s absent", [group_by]), concat(", ", _first(names))]) |
	group_by != null
	names := sort([node |
		some kind in _kinds
		kind.group == sprintf("%s absent", [group_by])
		some node in kind.nodes
	])
	count(names) > 0
]

# At most 10 names, then how many more.
_first(names) := names if {
	count(names) <= 10
} else := array.concat(array.slice(names, 0, 10), [sprintf("and %d more", [count(names) - 10])])
