package virtrules.node.migratability_test

import data.virtrules.node.migratability

# Helpers ---------------------------------------------------------------------------------------
#
# _levels evaluates a node list three ways that must agree: `decision`, `signature` + `levels`
# with opaque group ids after a JSON round trip (what the Go engine does), and a brute-force
# pairwise reference written independently of the module.

_levels(nodes) := levels if {
	levels := migratability.decision.levels with input as {"nodes": nodes}
	levels == _via_groups(nodes)
	levels == _reference(nodes)
}

_node(name, labels) := {"metadata": {"name": name, "labels": labels}}

_labels(prefix, names) := {concat("/", [prefix, name]): "true" | some name in names}

# The CPU labels KubeVirt's node labeller puts on a node.
_cpu(host, models, features, required) := object.union_n([
	_labels("host-model-cpu.node.kubevirt.io", [host]),
	_labels("cpu-model-migration.node.kubevirt.io", models),
	_labels("cpu-feature.node.kubevirt.io", features),
	_labels("host-model-required-features.node.kubevirt.io", required),
])

# Three CPU generations: each newer one accepts the older models and has more features, and a
# host-model VM started on it requires its newest feature.
_skylake := _cpu("Skylake", ["Skylake"], ["vmx", "pku"], ["pku"])

_cascadelake := _cpu("Cascadelake", ["Skylake", "Cascadelake"], ["vmx", "pku", "avx512vnni"], ["pku", "avx512vnni"])

_icelake := _cpu("Icelake", ["Skylake", "Cascadelake", "Icelake"], ["vmx", "pku", "avx512vnni", "gfni"], ["pku", "gfni"])

_unschedulable(node) := object.union(node, {"spec": {"unschedulable": true}})

_three_generations := [
	_node("sky-1", _skylake),
	_node("sky-2", _skylake),
	_node("cascade-1", _cascadelake),
	_node("cascade-2", _cascadelake),
	_node("ice-1", _icelake),
]

# Signatures + levels, as the Go engine would call them: the signatures of all nodes in one
# evaluation, grouped by equality under an opaque id, counts per group, everything through JSON.
_signature_of(node) := json.unmarshal(json.marshal(_signature(node)))

# A node's signature, as the signature entrypoint gives it.
_signature(node) := sig if {
	sig := migratability.signature with input as {"node": node}
}

_via_groups(nodes) := {node.metadata.name: levels[_group_id(sig)] |
	some i, node in nodes
	sig := signatures[format_int(i, 10)]
	levels[_group_id(sig)]
} if {
	signatures := json.unmarshal(json.marshal(migratability.signatures)) with input as {"nodes": {format_int(i, 10): node | some i, node in nodes}}
	groups := {_group_id(sig): {"signature": sig, "count": count([s | some s in signatures; s == sig])} |
		some sig in signatures
	}
	levels := migratability.levels with input as json.unmarshal(json.marshal({"groups": groups}))
	levels == _via_reach(groups)
}

# The same groups with `reach` computed without their counts and passed back, through JSON, as
# the engine does between nodes joining and leaving.
_via_reach(groups) := levels if {
	signatures := {id: {"signature": group.signature} | some id, group in groups}
	reach := json.unmarshal(json.marshal(migratability.reach)) with input as {"groups": signatures}
	levels := migratability.levels with input as json.unmarshal(json.marshal({"groups": groups, "reach": reach}))
}

_group_id(sig) := crypto.sha256(json.marshal(sig))

# Brute-force reference ---------------------------------------------------------------------------
#
# Straight from the design: for every schedulable host-model node, try every other node.

_reference(nodes) := {a.metadata.name: _reference_level(i, a, nodes) |
	some i, a in nodes
	_reference_schedulable(a)
	_reference_host(a)
}

_reference_level(i, a, nodes) := 0 if {
	count(_reference_others(i, nodes)) == 0
} else := floor((100 * count(reachable)) / count(others)) if {
	others := _reference_others(i, nodes)
	reachable := [b | some b in others; _reference_can_migrate(a, b)]
}

_reference_others(i, nodes) := [b | some j, b in nodes; j != i; _reference_schedulable(b)]

_reference_schedulable(node) if {
	not node.spec.unschedulable == true
	not node.metadata.labels["kubevirt.io/schedulable"] == "false"
}

_reference_names(node, prefix) := [substring(key, count(prefix), -1) |
	some key, value in node.metadata.labels
	value == "true"
	startswith(key, prefix)
]

_reference_host(node) := hosts[0] if {
	hosts := _reference_names(node, "host-model-cpu.node.kubevirt.io/")
	count(hosts) == 1
}

_reference_can_migrate(a, b) if {
	b.metadata.labels[concat("", ["cpu-model-migration.node.kubevirt.io/", _reference_host(a)])] == "true"
	every feature in _reference_names(a, "host-model-required-features.node.kubevirt.io/") {
		b.metadata.labels[concat("", ["cpu-feature.node.kubevirt.io/", feature])] == "true"
	}
}

# A pseudo-random cluster: n nodes, each a mix of 3 host models (or none), 3 migration models,
# 4 features and required features, some "false" labels, some unschedulable. Node i and node
# i + 7 get the same labels, so groups have several members.
_random_cluster(seed, n) := [_node(sprintf("node-%d", [i]), _random_labels(seed, i % 7)) | some i in numbers.range(0, n - 1)]

_hash(seed, i, j) := ((((seed * 131) + (i * 31)) + (j * 17)) + ((i * j) * 7)) % 13

_random_labels(seed, i) := object.union_n([
	{concat("/", ["host-model-cpu.node.kubevirt.io", model]): "true" |
		some k, model in ["Skylake", "Cascadelake", "Icelake"]
		_hash(seed, i, 0) % 4 == k
	},
	{concat("/", ["cpu-model-migration.node.kubevirt.io", model]): _bool((_hash(seed, i, k + 1) % 3) != 0) |
		some k, model in ["Skylake", "Cascadelake", "Icelake"]
		_hash(seed, i, k + 1) % 5 != 0
	},
	{concat("/", ["cpu-feature.node.kubevirt.io", feature]): _bool((_hash(seed, i, k + 10) % 4) != 0) |
		some k, feature in ["a", "b", "c", "d"]
	},
	{concat("/", ["host-model-required-features.node.kubevirt.io", feature]): "true" |
		some k, feature in ["a", "b", "c", "d"]
		_hash(seed, i, k + 20) % 3 == 0
	},
	{"kubevirt.io/schedulable": _bool((_hash(seed, i, 30) % 6) != 0)},
])

_bool(true) := "true"

_bool(false) := "false"

# Levels ------------------------------------------------------------------------------------------

test_three_generations if {
	# Skylake VMs go anywhere, Cascadelake VMs to Cascadelake and Icelake, Icelake VMs nowhere.
	_levels(_three_generations) == {"sky-1": 100, "sky-2": 100, "cascade-1": 50, "cascade-2": 50, "ice-1": 0}
}

test_level_is_rounded_down if {
	nodes := [
		_node("sky-1", _skylake),
		_node("cascade-1", _cascadelake),
		_node("cascade-2", _cascadelake),
		_node("ice-1", _icelake),
	]

	# cascade-1 reaches cascade-2 and ice-1 of the 3 others: 66.67 -> 66.
	_levels(nodes) == {"sky-1": 100, "cascade-1": 66, "cascade-2": 66, "ice-1": 0}
}

test_a_node_does_not_count_itself if {
	_levels([_node("a", _skylake), _node("b", _skylake)]) == {"a": 100, "b": 100}
	_levels([_node("a", _icelake), _node("b", _skylake)]) == {"a": 0, "b": 100}
}

test_a_node_incompatible_with_itself_subtracts_nothing if {
	# Missing its own required feature: its twin is no destination, the Icelake node is.
	odd := _cpu("Skylake", ["Skylake"], ["vmx"], ["pku"])
	_levels([_node("odd-1", odd), _node("odd-2", odd), _node("ice-1", _icelake)]) == {"odd-1": 50, "odd-2": 50, "ice-1": 0}
}

test_single_node_is_zero if {
	_levels([_node("only", _skylake)]) == {"only": 0}
}

test_only_schedulable_node_is_zero if {
	_levels([_node("only", _skylake), _unschedulable(_node("cordoned", _skylake))]) == {"only": 0}
}

test_no_nodes if {
	_levels([]) == {}
	migratability.decision == {"levels": {}} with input as {}
}

test_unschedulable_nodes_get_no_level_and_are_no_destination if {
	nodes := array.concat(_three_generations, [
		_unschedulable(_node("ice-cordoned", _icelake)),
		_node("ice-disabled", object.union(_icelake, {"kubevirt.io/schedulable": "false"})),
	])
	_levels(nodes) == {"sky-1": 100, "sky-2": 100, "cascade-1": 50, "cascade-2": 50, "ice-1": 0}
}

test_schedulable_label_true_is_schedulable if {
	nodes := [_node("a", _skylake), _node("b", object.union(_skylake, {"kubevirt.io/schedulable": "true"}))]
	_levels(nodes) == {"a": 100, "b": 100}
}

test_nodes_without_host_model_are_destinations_without_level if {
	plain := object.remove(_icelake, {"host-model-cpu.node.kubevirt.io/Icelake"})
	_levels([_node("sky-1", _skylake), _node("plain", plain), _node("bare", {})]) == {"sky-1": 50}
}

test_several_host_models_are_ambiguous if {
	both := object.union(_skylake, _labels("host-model-cpu.node.kubevirt.io", ["Cascadelake"]))
	_levels([_node("both", both), _node("sky-1", _skylake)]) == {"sky-1": 100}
	sig := migratability.signature with input as {"node": _node("both", both)}
	sig.hostModel == null
}

test_false_labels_are_absent if {
	no_host := object.union(_skylake, {"host-model-cpu.node.kubevirt.io/Skylake": "false"})
	no_model := object.union(_icelake, {"cpu-model-migration.node.kubevirt.io/Skylake": "false"})
	no_feature := object.union(_icelake, {"cpu-feature.node.kubevirt.io/pku": "false"})
	not_required := object.union(_cascadelake, {"host-model-required-features.node.kubevirt.io/avx512vnni": "false"})
	nodes := [
		_node("sky-1", _skylake),
		_node("no-host", no_host),
		_node("no-model", no_model),
		_node("no-feature", no_feature),
		_node("not-required", not_required),
	]

	# no-host is a destination for sky-1 but gets no level; no-model takes no Skylake VMs;
	# no-feature lacks pku, which every host model here requires; not-required now needs only
	# pku, so no-model takes its VMs.
	_levels(nodes) == {"sky-1": 50, "no-model": 0, "no-feature": 25, "not-required": 25}
}

test_malformed_nodes_and_labels if {
	nodes := [
		_node("sky-1", _skylake),
		"not a node",
		{"metadata": "no labels here"},
		{"metadata": {"labels": _skylake}},
		_node("odd-labels", {
			"cpu-feature.node.kubevirt.io/": "true",
			"/pku": "true",
			"host-model-cpu.node.kubevirt.io": "true",
			"cpu-model-migration.node.kubevirt.io/Skylake": true,
			"cpu-model-migration.node.kubevirt.io/Skylake/v2": "true",
		}),
	]

	# Every object counts as a node: the nameless Skylake node is a destination and gets no
	# level, the label-less node and odd-labels are schedulable but no destination: 1 of 3.
	migratability.decision.levels == {"sky-1": 33} with input as {"nodes": nodes}
	migratability.signature == {
		"schedulable": true, "hostModel": null,
		"requiredFeatures": [], "models": [], "features": [],
	} with input as {"node": nodes[4]}
	not migratability.signature with input as {"node": "not a node"}
}

test_signature if {
	node := _unschedulable(_node("ice-1", _icelake))
	migratability.signature == {
		"schedulable": false,
		"hostModel": "Icelake",
		"requiredFeatures": ["gfni", "pku"],
		"models": ["Cascadelake", "Icelake", "Skylake"],
		"features": ["avx512vnni", "gfni", "pku", "vmx"],
	} with input as {"node": node}
}

test_signatures_are_each_nodes_signature if {
	nodes := {
		"sky": _node("sky-1", object.union(_skylake, {"kubernetes.io/hostname": "sky-1"})),
		"ice": _unschedulable(_node("ice-1", _icelake)),
		"bare": {},
		"bad": "not a node",
	}
	signatures := migratability.signatures with input as {"nodes": nodes}
	signatures == {id: _signature(node) | some id, node in nodes}
	count(signatures) == 3
	not migratability.signatures with input as {"nodes": [nodes.sky]}
	not migratability.signatures with input as {}
}

test_nodes_differing_in_other_labels_are_interchangeable if {
	nodes := [
		_node("sky-1", object.union(_skylake, {"topology.kubernetes.io/zone": "a", "gpu": "true"})),
		_node("sky-2", object.union(_skylake, {"topology.kubernetes.io/zone": "b"})),
		_node("sky-3", object.union(_skylake, {"cpu-feature.node.kubevirt.io/avx512vnni": "false"})),
		_node("ice-1", object.union(_icelake, {"kubevirt.io/schedulable": "true"})),
	]
	_levels(nodes) == {"sky-1": 100, "sky-2": 100, "sky-3": 100, "ice-1": 0}
}

test_signature_ignores_other_labels if {
	noisy := object.union(_skylake, {"kubernetes.io/hostname": "sky-1", "cpu-model.node.kubevirt.io/Skylake": "true"})
	sig := migratability.signature with input as {"node": _node("sky-1", noisy)}
	sig == migratability.signature with input as {"node": _node("sky-2", _skylake)}
}

test_decision_matches_reference_on_random_clusters if {
	every seed in numbers.range(1, 6) {
		nodes := _random_cluster(seed, 16)
		_levels(nodes) == _reference(nodes)
		count(_reference(nodes)) > 0
	}
}

test_random_clusters_are_varied if {
	# The generator exercises levels strictly between 0 and 100 and several groups.
	levels := {level | some seed in numbers.range(1, 6); some level in _reference(_random_cluster(seed, 16))}
	count({level | some level in levels; level > 0; level < 100}) > 3
	signatures := {sig | some node in _random_cluster(3, 16); sig := _signature_of(node)}
	count(signatures) > 4
}

# Levels of signature groups ----------------------------------------------------------------------

_sky_sig := _signature_of(_node("x", _skylake))

_cascade_sig := _signature_of(_node("x", _cascadelake))

_ice_sig := _signature_of(_node("x", _icelake))

test_levels_with_opaque_ids if {
	groups := {
		"7f3a": {"signature": _sky_sig, "count": 2},
		"b001": {"signature": _cascade_sig, "count": 2},
		"zz": {"signature": _ice_sig, "count": 1},
	}
	migratability.levels == {"7f3a": 100, "b001": 50, "zz": 0} with input as {"groups": groups}
}

test_levels_ids_sharing_a_signature_add_up if {
	by_id := {
		"a": {"signature": _cascade_sig, "count": 1},
		"b": {"signature": _cascade_sig, "count": 1},
		"c": {"signature": _sky_sig, "count": 2},
	}
	migratability.levels == {"a": 33, "b": 33, "c": 100} with input as {"groups": by_id}
}

test_levels_of_empty_and_unschedulable_groups if {
	cordoned := object.union(_ice_sig, {"schedulable": false})
	groups := {
		"sky": {"signature": _sky_sig, "count": 1},
		"gone": {"signature": _cascade_sig, "count": 0},
		"cordoned": {"signature": cordoned, "count": 4},
	}
	migratability.levels == {"sky": 0} with input as {"groups": groups}
	migratability.levels == {} with input as {"groups": {}}
}

test_levels_after_a_new_signature_joins if {
	before := {"s": {"signature": _sky_sig, "count": 2}, "i": {"signature": _ice_sig, "count": 1}}
	after := object.union(before, {"c": {"signature": _cascade_sig, "count": 1}})
	migratability.levels == {"s": 100, "i": 0} with input as {"groups": before}
	migratability.levels == {"s": 100, "i": 0, "c": 33} with input as {"groups": after}
}

test_levels_undefined_for_malformed_groups if {
	not migratability.levels with input as {}
	not migratability.levels with input as {"groups": []}
	every group in [
		"x",
		{"signature": _sky_sig},
		{"signature": _sky_sig, "count": -1},
		{"signature": _sky_sig, "count": 1.5},
		{"signature": _sky_sig, "count": "1"},
		{"signature": object.union(_sky_sig, {"schedulable": "yes"}), "count": 1},
		{"signature": object.union(_sky_sig, {"hostModel": 7}), "count": 1},
		{"signature": object.union(_sky_sig, {"features": "pku"}), "count": 1},
		{"signature": object.union(_sky_sig, {"models": [1]}), "count": 1},
		{"signature": object.union(_sky_sig, {"features": ["pku", "pku"]}), "count": 1},
		{"signature": object.union(_sky_sig, {"features": ["pku", ["vmx"]]}), "count": 1},
		{"signature": object.union(_sky_sig, {"requiredFeatures": [null, "pku"]}), "count": 1},
		{"signature": object.union(_sky_sig, {"models": [{"Skylake": true}]}), "count": 1},
		{"signature": object.remove(_sky_sig, {"requiredFeatures"}), "count": 1},
	] {
		not migratability.levels with input as {"groups": {"ok": {"signature": _sky_sig, "count": 1}, "bad": group}}
	}
}

test_reach_lists_what_each_source_reaches if {
	groups := {
		"s": {"signature": _sky_sig},
		"c": {"signature": _cascade_sig},
		"i": {"signature": _ice_sig},
		"off": {"signature": object.union(_ice_sig, {"schedulable": false})},
		"none": {"signature": object.union(_sky_sig, {"hostModel": null})},
	}
	reach := migratability.reach with input as {"groups": groups}
	reach.sources == [["c", "i"], ["i"], ["c", "i", "none", "s"]]
	reach.groups == {
		"s": {"schedulable": true, "source": 2, "self": 1},
		"c": {"schedulable": true, "source": 0, "self": 1},
		"i": {"schedulable": true, "source": 1, "self": 1},
		"off": {"schedulable": false, "source": -1, "self": 1},
		"none": {"schedulable": true, "source": -1, "self": 0},
	}
}

test_levels_with_reach_after_counts_change if {
	signatures := {"s": {"signature": _sky_sig}, "c": {"signature": _cascade_sig}, "i": {"signature": _ice_sig}}
	reach := migratability.reach with input as {"groups": signatures}
	every counts in [{"s": 2, "c": 2, "i": 1}, {"s": 1, "c": 0, "i": 1}, {"s": 5, "c": 1, "i": 0}] {
		groups := {id: {"signature": group.signature, "count": counts[id]} | some id, group in signatures}
		want := migratability.levels with input as {"groups": groups}
		migratability.levels == want with input as {"groups": groups, "reach": reach}
	}
}

test_reach_and_indexed_levels_undefined_for_malformed_input if {
	not migratability.reach with input as {}
	not migratability.reach with input as {"groups": {"bad": {"signature": object.union(_sky_sig, {"models": [1]})}}}
	reach := migratability.reach with input as {"groups": {"s": {"signature": _sky_sig}}}
	not migratability.levels with input as {"groups": {"s": {"signature": _sky_sig, "count": -1}}, "reach": reach}

	# Reach for other ids is not used: the comparisons are made again.
	migratability.levels == {"x": 0} with input as {"groups": {"x": {"signature": _sky_sig, "count": 1}}, "reach": reach}
	migratability.levels == {"s": 0} with input as {"groups": {"s": {"signature": _sky_sig, "count": 1}}, "reach": reach}
}

test_level_label if {
	migratability.level_label == "kubevirt/host-model-migratability-level"
}

# Scheduling affinity -----------------------------------------------------------------------------

_vmi(spec) := {"metadata": {"name": "vm", "namespace": "ns"}, "spec": spec}

_host_model_vmi := _vmi({"domain": {"cpu": {"model": "host-model"}}})

_kubevirt(migrations) := {"spec": {"configuration": {"migrations": migrations}}}

_affinity(vmi, kubevirt) := got if {
	got := migratability.scheduling_affinity with input as {"vmi": vmi, "kubevirt": kubevirt}
}

_gt(value) := {"key": "kubevirt/host-model-migratability-level", "operator": "Gt", "values": [value]}

_disk := {"key": "disktype", "operator": "In", "values": ["ssd"]}

_zone := {"key": "zone", "operator": "In", "values": ["a"]}

_gpu_preference := {"weight": 40, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}

test_require_without_affinity if {
	_affinity(_host_model_vmi, _kubevirt({"requireHostModelMigratabilityLevel": 50})) == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [_gt("49")]}]}}
}

test_require_is_anded_into_every_ored_term if {
	vmi := _vmi({
		"domain": {"cpu": {"model": "host-model"}},
		"affinity": {"nodeAffinity": {
			"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
				{"matchExpressions": [_disk]},
				{"matchExpressions": [_zone], "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
			]},
			"preferredDuringSchedulingIgnoredDuringExecution": [_gpu_preference],
		}},
	})
	_affinity(vmi, _kubevirt({"requireHostModelMigratabilityLevel": 80})) == {
		"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [_disk, _gt("79")]},
			{"matchExpressions": [_zone, _gt("79")], "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
		]},
		"preferredDuringSchedulingIgnoredDuringExecution": [_gpu_preference],
	}
}

test_require_bounds if {
	_affinity(_host_model_vmi, _kubevirt({"requireHostModelMigratabilityLevel": 0})).requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == [{"matchExpressions": [_gt("-1")]}]
	_affinity(_host_model_vmi, _kubevirt({"requireHostModelMigratabilityLevel": 100})).requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == [{"matchExpressions": [_gt("99")]}]
}

test_prefer_is_appended_to_existing_preferences if {
	vmi := _vmi({
		"domain": {"cpu": {"model": "host-model"}},
		"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [_gpu_preference]}},
	})
	_affinity(vmi, _kubevirt({"preferedHostModelMigratabilityLevel": {"level": 70, "weight": 20}})) == {"preferredDuringSchedulingIgnoredDuringExecution": [
		_gpu_preference,
		{"weight": 20, "preference": {"matchExpressions": [_gt("69")]}},
	]}
}

test_prefer_default_weight_is_the_lowest if {
	_affinity(_host_model_vmi, _kubevirt({"preferedHostModelMigratabilityLevel": {"level": 70}})) == {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [_gt("69")]}}]}
	_affinity(_host_model_vmi, _kubevirt({"preferedHostModelMigratabilityLevel": {"level": 70, "weight": null}})) == {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [_gt("69")]}}]}
}

test_prefer_both_spellings if {
	knob := {"level": 30, "weight": 100}
	want := {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {"matchExpressions": [_gt("29")]}}]}
	_affinity(_host_model_vmi, _kubevirt({"preferedHostModelMigratabilityLevel": knob})) == want
	_affinity(_host_model_vmi, _kubevirt({"preferredHostModelMigratabilityLevel": knob})) == want
	_affinity(_host_model_vmi, _kubevirt({"preferedHostModelMigratabilityLevel": knob, "preferredHostModelMigratabilityLevel": knob})) == want
}

test_prefer_conflicting_spellings if {
	got := _affinity(_host_model_vmi, _kubevirt({
		"preferedHostModelMigratabilityLevel": {"level": 30},
		"preferredHostModelMigratabilityLevel": {"level": 40},
	}))
	got == {"error": "spec.configuration.migrations.preferredHostModelMigratabilityLevel: conflicts with spec.configuration.migrations.preferedHostModelMigratabilityLevel; set only one"}
}

test_require_and_prefer if {
	vmi := _vmi({
		"domain": {"cpu": {"model": "host-model"}},
		"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [_disk]},
			{"matchExpressions": [_zone]},
		]}}},
	})
	got := _affinity(vmi, _kubevirt({
		"requireHostModelMigratabilityLevel": 40,
		"preferedHostModelMigratabilityLevel": {"level": 90, "weight": 10},
	}))
	got == {
		"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [_disk, _gt("39")]},
			{"matchExpressions": [_zone, _gt("39")]},
		]},
		"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchExpressions": [_gt("89")]}}],
	}
}

test_whole_number_floats_are_integers if {
	got := _affinity(_host_model_vmi, _kubevirt({
		"requireHostModelMigratabilityLevel": 40.0,
		"preferredHostModelMigratabilityLevel": {"level": 90.0, "weight": 10.0},
	}))
	got.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == [{"matchExpressions": [_gt("39")]}]
	got.preferredDuringSchedulingIgnoredDuringExecution == [{"weight": 10, "preference": {"matchExpressions": [_gt("89")]}}]
}

test_invalid_knobs if {
	path := "spec.configuration.migrations"
	cases := [
		[{"requireHostModelMigratabilityLevel": 101}, "requireHostModelMigratabilityLevel: must be an integer from 0 to 100, got 101"],
		[{"requireHostModelMigratabilityLevel": -1}, "requireHostModelMigratabilityLevel: must be an integer from 0 to 100, got -1"],
		[{"requireHostModelMigratabilityLevel": 2.5}, "requireHostModelMigratabilityLevel: must be an integer from 0 to 100, got 2.5"],
		[{"requireHostModelMigratabilityLevel": "50"}, "requireHostModelMigratabilityLevel: must be an integer from 0 to 100, got 50"],
		[{"preferedHostModelMigratabilityLevel": 50}, "preferedHostModelMigratabilityLevel: must be an object with level and weight, got 50"],
		[{"preferedHostModelMigratabilityLevel": {"weight": 5}}, "preferedHostModelMigratabilityLevel.level: must be an integer from 0 to 100, got null"],
		[{"preferredHostModelMigratabilityLevel": {"level": 200}}, "preferredHostModelMigratabilityLevel.level: must be an integer from 0 to 100, got 200"],
		[{"preferedHostModelMigratabilityLevel": {"level": 50, "weight": 0}}, "preferedHostModelMigratabilityLevel.weight: must be an integer from 1 to 100, got 0"],
		[{"preferedHostModelMigratabilityLevel": {"level": 50, "weight": 101}}, "preferedHostModelMigratabilityLevel.weight: must be an integer from 1 to 100, got 101"],
		[{"preferedHostModelMigratabilityLevel": {"level": 50, "weight": "high"}}, "preferedHostModelMigratabilityLevel.weight: must be an integer from 1 to 100, got high"],
	]
	every case in cases {
		_affinity(_host_model_vmi, _kubevirt(case[0])) == {"error": concat(".", [path, case[1]])}
	}
}

test_several_invalid_knobs_are_all_reported if {
	got := _affinity(_host_model_vmi, _kubevirt({
		"requireHostModelMigratabilityLevel": 101,
		"preferedHostModelMigratabilityLevel": {"level": 50, "weight": 0},
	}))
	got == {"error": concat("; ", [
		"spec.configuration.migrations.preferedHostModelMigratabilityLevel.weight: must be an integer from 1 to 100, got 0",
		"spec.configuration.migrations.requireHostModelMigratabilityLevel: must be an integer from 0 to 100, got 101",
	])}
}

test_invalid_knobs_do_not_matter_when_not_applicable if {
	_affinity(_vmi({"domain": {"cpu": {"model": "Skylake"}}}), _kubevirt({"requireHostModelMigratabilityLevel": 101})) == null
}

test_unset_cpu_model_is_host_model if {
	want := {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [_gt("49")]}]}}
	kubevirt := _kubevirt({"requireHostModelMigratabilityLevel": 50})
	_affinity(_vmi({}), kubevirt) == want
	_affinity(_vmi({"domain": {"cpu": {"cores": 2}}}), kubevirt) == want
	_affinity(_vmi({"domain": {"cpu": {"model": ""}}}), kubevirt) == want
	_affinity(_vmi({}), object.union(kubevirt, {"spec": {"configuration": {"cpuModel": "host-model"}}})) == want
}

test_unset_cpu_model_follows_the_cluster_default if {
	kubevirt := object.union(_kubevirt({"requireHostModelMigratabilityLevel": 50}), {"spec": {"configuration": {"cpuModel": "Skylake"}}})
	_affinity(_vmi({}), kubevirt) == null
	_affinity(_host_model_vmi, kubevirt) == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [_gt("49")]}]}}
}

test_not_host_model_is_null if {
	kubevirt := _kubevirt({"requireHostModelMigratabilityLevel": 50})
	_affinity(_vmi({"domain": {"cpu": {"model": "host-passthrough"}}}), kubevirt) == null
	_affinity(_vmi({"domain": {"cpu": {"model": "Cascadelake-Server"}}}), kubevirt) == null
}

test_already_scheduled_is_null if {
	kubevirt := _kubevirt({"requireHostModelMigratabilityLevel": 50})
	scheduled := object.union(_host_model_vmi, {"status": {"nodeName": "node-1"}})
	_affinity(scheduled, kubevirt) == null
	pending := object.union(_host_model_vmi, {"status": {"nodeName": ""}})
	_affinity(pending, kubevirt) != null
}

test_no_knob_is_null if {
	_affinity(_host_model_vmi, null) == null
	_affinity(_host_model_vmi, {}) == null
	_affinity(_host_model_vmi, _kubevirt({})) == null
	_affinity(_host_model_vmi, _kubevirt({"bandwidthPerMigration": "64Mi"})) == null
	_affinity(_host_model_vmi, _kubevirt({"requireHostModelMigratabilityLevel": null, "preferedHostModelMigratabilityLevel": null})) == null
	_affinity(_host_model_vmi, {"spec": {"configuration": {"migrations": "bogus"}}}) == null
	migratability.scheduling_affinity == null with input as {"vmi": _host_model_vmi}
}

test_missing_vmi_is_null if {
	migratability.scheduling_affinity == null with input as {"kubevirt": _kubevirt({"requireHostModelMigratabilityLevel": 50})}
	_affinity("vm", _kubevirt({"requireHostModelMigratabilityLevel": 50})) == null
}

# The engine reduces a node to its labels under signature_label_prefixes before asking for its
# signature; that must never change the signature.
test_signature_reads_only_labels_under_the_prefixes if {
	node := {
		"metadata": {"name": "n", "labels": {
			"kubernetes.io/hostname": "n",
			"host-model-cpu.node.kubevirt.io/Skylake": "true",
			"host-model-required-features.node.kubevirt.io/avx512": "true",
			"cpu-model-migration.node.kubevirt.io/Skylake": "true",
			"cpu-feature.node.kubevirt.io/avx512": "true",
			"cpu-feature.node.kubevirt.io/a/b": "true",
			"kubevirt.io/schedulable": "true",
			"feature.node.kubernetes.io/cpu-model.family": "6",
		}},
		"spec": {"unschedulable": false},
	}
	reduced := {
		"metadata": {"labels": {key: value |
			some key, value in node.metadata.labels
			some prefix in migratability.signature_label_prefixes
			startswith(key, prefix)
		}},
		"spec": node.spec,
	}
	count(reduced.metadata.labels) == 6
	full := migratability.signature with input as {"node": node}
	from_reduced := migratability.signature with input as {"node": reduced}
	full == from_reduced
	full.hostModel == "Skylake"
	full.requiredFeatures == ["avx512"]
}

_annotated(annotations) := {"metadata": {"annotations": annotations}}

test_knobs_from_annotations if {
	got := _affinity(_host_model_vmi, _annotated({
		"migrations.virt-rules.io/require-host-model-migratability-level": "40",
		"migrations.virt-rules.io/preferred-host-model-migratability-level": `{"level": 90, "weight": 10}`,
	}))
	got == {
		"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [_gt("39")]}]},
		"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchExpressions": [_gt("89")]}}],
	}
}

test_invalid_annotations if {
	require := "metadata.annotations[\"migrations.virt-rules.io/require-host-model-migratability-level\"]"
	prefer := "metadata.annotations[\"migrations.virt-rules.io/preferred-host-model-migratability-level\"]"
	cases := [
		[{"migrations.virt-rules.io/require-host-model-migratability-level": "high"}, concat("", [require, ": must be an integer from 0 to 100, got high"])],
		[{"migrations.virt-rules.io/require-host-model-migratability-level": "101"}, concat("", [require, ": must be an integer from 0 to 100, got 101"])],
		[{"migrations.virt-rules.io/preferred-host-model-migratability-level": "80"}, concat("", [prefer, ": must be an object with level and weight, got 80"])],
		[{"migrations.virt-rules.io/preferred-host-model-migratability-level": "{level"}, concat("", [prefer, ": must be an object with level and weight, got {level"])],
		[{"migrations.virt-rules.io/preferred-host-model-migratability-level": `{"level": 80, "weight": 0}`}, concat("", [prefer, ".weight: must be an integer from 1 to 100, got 0"])],
	]
	every case in cases {
		_affinity(_host_model_vmi, _annotated(case[0])) == {"error": case[1]}
	}
}

test_annotation_and_field_conflict if {
	kubevirt := object.union(
		_kubevirt({"requireHostModelMigratabilityLevel": 50}),
		_annotated({"migrations.virt-rules.io/require-host-model-migratability-level": "60"}),
	)
	_affinity(_host_model_vmi, kubevirt) == {"error": "spec.configuration.migrations.requireHostModelMigratabilityLevel: conflicts with metadata.annotations[\"migrations.virt-rules.io/require-host-model-migratability-level\"]; set only one"}
}
