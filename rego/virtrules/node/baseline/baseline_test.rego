package virtrules.node.baseline_test

import data.virtrules.node.baseline

# A cpu_map of made-up models, so each test reads what it is about; the real one is libvirt's
# (cpu_map/data.json), checked by internal/cpumap and judged against libvirt by test/fidelity.
_cpu_map := {"libvirt": "0.0.0", "models": {"x86_64": {
	"Old": {"vendor": "Intel", "features": ["a", "b"]},
	"Mid": {"vendor": "Intel", "features": ["a", "b", "c", "d"]},
	"Mid-alt": {"vendor": "Intel", "features": ["a", "b", "c", "e"]},
	"New": {"vendor": "Intel", "features": ["a", "b", "c", "d", "e", "f"]},
	"Zen": {"vendor": "AMD", "features": ["a", "b", "x"]},
	"generic": {"features": ["a"]},
}}}

_settings := {"groupBy": null, "maxTradeoffs": 3}

_decide(nodes) := d if {
	d := baseline.decision with input as {"nodes": nodes}
		with baseline.cpu_map as _cpu_map
		with baseline.settings as _settings
}

_labels(prefix, names) := {concat("", [prefix, name]): "true" | some name in names}

# The CPU labels KubeVirt's node labeller puts on a node of vendor, running models, with
# features.
_cpu(vendor, models, features) := object.union_n([
	_labels("cpu-vendor.node.kubevirt.io/", [vendor]),
	_labels("cpu-model.node.kubevirt.io/", models),
	_labels("cpu-feature.node.kubevirt.io/", features),
	_labels("host-model-cpu.node.kubevirt.io/", [models[count(models) - 1]]),
	{"kubevirt.io/schedulable": "true", "kubernetes.io/hostname": "ignored"},
])

_node(name, labels) := {"metadata": {"name": name, "labels": labels}}

_old := _cpu("Intel", ["generic", "Old"], ["a", "b", "g"])

_mid := _cpu("Intel", ["generic", "Old", "Mid"], ["a", "b", "c", "d", "g"])

_new := _cpu("Intel", ["generic", "Old", "Mid", "Mid-alt", "New"], ["a", "b", "c", "d", "e", "f", "g"])

_zen := _cpu("AMD", ["generic", "Zen"], ["a", "b", "x"])

_group(d) := d.groups[0] if count(d.groups) == 1

test_one_kind_runs_its_own_model if {
	g := _group(_decide([_node("n1", _new), _node("n2", _new)]))
	g.model == "New"
	g.vendor == "Intel"
	g.features == [{"name": "g", "policy": "require"}]
	g.guestFeatures == ["a", "b", "c", "d", "e", "f", "g"]
	g.nodes == ["n1", "n2"]
	g.share == 100
	g.reason == ""
	g.tradeoffs == []
	g.group == ""
}

test_the_oldest_kind_sets_the_model_and_the_features_all_share if {
	g := _group(_decide([_node("new-1", _new), _node("new-2", _new), _node("mid-1", _mid)]))
	g.model == "Mid"
	g.features == [{"name": "g", "policy": "require"}]
	g.guestFeatures == ["a", "b", "c", "d", "g"]
	g.share == 100
	g.snippets == {
		"kubevirt": {"spec": {"configuration": {"cpuModel": "Mid"}}},
		"cpu": {"model": "Mid", "features": [{"name": "g", "policy": "require"}]},
	}
}

test_a_tradeoff_names_the_kind_that_costs_and_what_the_rest_would_gain if {
	g := _group(_decide([_node("new-1", _new), _node("new-2", _new), _node("mid-1", _mid), _node("old-1", _old)]))
	g.model == "Old"
	g.tradeoffs == [{
		"nodes": ["old-1"], "hostModel": "Old", "vendor": "Intel", "model": "Mid",
		"gainedFeatures": ["c", "d"],
	}]
}

test_tradeoffs_most_gain_first_and_bounded if {
	nodes := [_node("new-1", _new), _node("mid-1", _mid), _node("old-1", _old)]
	d := baseline.decision with input as {"nodes": nodes}
		with baseline.cpu_map as _cpu_map
		with baseline.settings as {"groupBy": null, "maxTradeoffs": 1}
	[t] := _group(d).tradeoffs
	t.nodes == ["old-1"]
}

test_vendors_differ_gives_no_model_and_says_which_side_costs if {
	g := _group(_decide([_node("i1", _new), _node("i2", _new), _node("z1", _zen)]))
	g.model == null
	g.reason == "VendorsDiffer"
	g.message == "the nodes are of 2 vendors (AMD: 1, Intel: 2): no guest CPU runs on all of them"
	g.features == []
	g.share == 0
	g.snippets == {}
	[t1, t2] := g.tradeoffs

	# Without the AMD node the rest would run New: the larger gain comes first.
	t1.nodes == ["z1"]
	t1.model == "New"
	t2.nodes == ["i1", "i2"]
	t2.model == "Zen"
}

test_no_common_model if {
	a := _cpu("Intel", ["Old"], ["a", "b"])
	b := _cpu("Intel", ["Mid"], ["a", "b", "c", "d"])
	g := _group(_decide([_node("a", a), _node("b", b)]))
	g.reason == "NoCommonModel"
	g.message == "no CPU model is among every node's cpu-model.node.kubevirt.io labels"
	g.vendor == "Intel"
}

test_a_common_model_unknown_to_cpu_map_is_not_chosen if {
	a := _cpu("Intel", ["Future"], ["a"])
	g := _group(_decide([_node("a", a)]))
	g.reason == "NoCommonModel"
	contains(g.message, "(Future) are not of the nodes' vendor or not in this bundle's cpu_map (libvirt 0.0.0)")
}

test_a_model_of_another_vendor_is_not_chosen if {
	# A usable Intel model on an AMD host: libvirt's baseline keeps to the host's vendor.
	z := _cpu("AMD", ["Zen", "New"], ["a", "b", "c", "d", "e", "f", "x"])
	g := _group(_decide([_node("z", z)]))
	g.model == "Zen"
}

test_a_model_without_vendor_is_a_candidate if {
	a := _cpu("Intel", ["generic"], ["a"])
	g := _group(_decide([_node("a", a)]))
	g.model == "generic"
	g.features == []
}

test_ties_go_to_the_first_name if {
	g := _group(_decide([_node("a", _cpu("Intel", ["Mid", "Mid-alt"], ["a", "b", "c", "d", "e"]))]))
	g.model == "Mid"
	g.features == [{"name": "e", "policy": "require"}]
}

test_a_model_feature_missing_from_the_labels_is_disabled if {
	# The node runs Mid but its labels lack d: the guest CPU keeps to the labels.
	g := _group(_decide([_node("a", _cpu("Intel", ["Mid"], ["a", "b", "c"]))]))
	g.model == "Mid"
	g.features == [{"name": "d", "policy": "disable"}]
	g.guestFeatures == ["a", "b", "c"]
}

test_unschedulable_and_unlabelled_nodes_are_listed_not_dropped if {
	cordoned := object.union(_node("cordoned", _new), {"spec": {"unschedulable": true}})
	refused := _node("refused", object.union(_new, {"kubevirt.io/schedulable": "false"}))
	bare := _node("bare", {"kubernetes.io/arch": "amd64"})
	no_models := _node("no-models", {"cpu-vendor.node.kubevirt.io/Intel": "true"})
	d := _decide([_node("new-1", _new), cordoned, refused, bare, no_models])
	g := _group(d)
	g.nodes == ["new-1"]
	[r.node | some r in g.notConsidered] == ["bare", "cordoned", "no-models", "refused"]
	{r.node: r.reason | some r in g.notConsidered} == {
		"bare": "NoCPULabels", "no-models": "NoCPULabels",
		"cordoned": "Unschedulable", "refused": "Unschedulable",
	}
}

test_a_group_of_no_node_considered_says_so if {
	g := _group(_decide([_node("bare", {})]))
	g.reason == "NoNodes"
	g.model == null
	g.nodes == []
	g.message == "no node of the cluster is considered: each is unschedulable or has no CPU labels of KubeVirt's node labeller"
	[r.node | some r in g.notConsidered] == ["bare"]
}

test_no_nodes_no_groups if {
	_decide([]).groups == []
}

test_a_zone_of_no_node_considered_is_named if {
	d := baseline.decision with input as {"nodes": [_zone(_node("a", {}), "a")], "groupBy": "topology.kubernetes.io/zone"}
		with baseline.cpu_map as _cpu_map
		with baseline.settings as _settings
	contains(_group(d).message, "no node of group topology.kubernetes.io/zone=a is considered")
}

test_label_prefixes_hold_the_group_label if {
	prefixes := baseline.label_prefixes with input as {"groupBy": "zone"}
		with baseline.settings as _settings
	"zone" in prefixes
	plain := baseline.label_prefixes with baseline.settings as _settings
	not "zone" in plain
}

_zone(node, zone) := object.union(node, {"metadata": {"labels": {"topology.kubernetes.io/zone": zone}}})

test_group_by_a_label_and_warn_of_nodes_without_it if {
	nodes := [
		_zone(_node("a-new", _new), "a"),
		_zone(_node("a-mid", _mid), "a"),
		_zone(_node("b-new", _new), "b"),
		_node("lost", _old),
	]
	d := baseline.decision with input as {"nodes": nodes, "groupBy": "topology.kubernetes.io/zone"}
		with baseline.cpu_map as _cpu_map
		with baseline.settings as _settings
	{g.group: g.model | some g in d.groups} == {
		"topology.kubernetes.io/zone absent": "Old",
		"topology.kubernetes.io/zone=a": "Mid",
		"topology.kubernetes.io/zone=b": "New",
	}
	d.warnings == ["1 node(s) have no label topology.kubernetes.io/zone and are grouped as \"topology.kubernetes.io/zone absent\": lost"]
}

test_group_by_from_settings if {
	nodes := [_zone(_node("a", _new), "a"), _zone(_node("b", _mid), "b")]
	d := baseline.decision with input as {"nodes": nodes}
		with baseline.cpu_map as _cpu_map
		with baseline.settings as {"groupBy": "topology.kubernetes.io/zone", "maxTradeoffs": 3}
	count(d.groups) == 2
	d.warnings == []
}

test_kinds_as_the_engine_gives_them_decide_as_nodes if {
	nodes := [_node("new-1", _new), _node("new-2", _new), _node("mid-1", _mid)]
	kinds := [
		{"nodes": ["new-2", "new-1"], "unschedulable": false, "labels": _new},
		{"nodes": ["mid-1"], "unschedulable": false, "labels": _mid},
	]
	by_kinds := baseline.decision with input as {"kinds": kinds}
		with baseline.cpu_map as _cpu_map
		with baseline.settings as _settings
	by_kinds == _decide(nodes)
}

test_first_names_then_how_many_more if {
	nodes := [_node(sprintf("n%02d", [i]), {"x": "1"}) | some i in numbers.range(1, 12)]
	d := baseline.decision with input as {"nodes": nodes, "groupBy": "zone"}
		with baseline.cpu_map as _cpu_map
		with baseline.settings as _settings
	d.warnings == ["12 node(s) have no label zone and are grouped as \"zone absent\": n01, n02, n03, n04, n05, n06, n07, n08, n09, n10, and 2 more"]
}

test_label_prefixes_name_what_a_kind_reads if {
	"cpu-feature.node.kubevirt.io/" in baseline.label_prefixes
	"cpu-model.node.kubevirt.io/" in baseline.label_prefixes
	"cpu-vendor.node.kubevirt.io/" in baseline.label_prefixes
}

test_a_tradeoff_takes_out_every_node_of_a_host_model if {
	# Two New nodes differ by a feature (microcode); the Old one holds both back.
	new_without_f := _cpu("Intel", ["generic", "Old", "Mid", "Mid-alt", "New"], ["a", "b", "c", "d", "e", "g"])
	g := _group(_decide([_node("new-1", _new), _node("new-2", new_without_f), _node("old-1", _old)]))
	g.model == "Old"
	[old] := g.tradeoffs
	old.nodes == ["old-1"]
	old.hostModel == "Old"
	old.gainedFeatures == ["c", "d", "e"]
}

test_a_tradeoff_is_kept_only_when_it_gains if {
	# Without both New nodes the Old one alone runs what all three run: no tradeoff of New.
	g := _group(_decide([_node("new-1", _new), _node("new-2", _new), _node("old-1", _old)]))
	[t.hostModel | some t in g.tradeoffs] == ["Old"]
}

test_a_cpu_snippet_without_features_names_the_model_alone if {
	g := _group(_decide([_node("a", _cpu("Intel", ["Mid"], ["a", "b", "c", "d"]))]))
	g.snippets.cpu == {"model": "Mid"}
}
