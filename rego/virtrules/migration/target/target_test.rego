package virtrules.migration.target_test

import data.virtrules.migration.target

# Fixtures -----------------------------------------------------------------------------------------

# Every fixture node carries kubevirt.io/schedulable=true, as virt-handler labels a node it runs on.
_node(name, labels) := {
	"metadata": {"name": name, "labels": object.union({"kubevirt.io/schedulable": "true"}, labels)},
	"status": {"allocatable": {"cpu": "4", "memory": "8Gi"}},
}

_nodes := [_node("node-1", {"disktype": "ssd"}), _node("node-2", {"disktype": "ssd"}), _node("node-3", {"disktype": "hdd"})]

# host-passthrough: no host-model CPU requirement, so that the fixtures' nodes need no CPU labels
# (the host-model tests set their model).
_vmi := {
	"metadata": {"namespace": "default", "name": "vmi-fedora"},
	"spec": {"domain": {"cpu": {"model": "host-passthrough"}, "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}},
	"status": {"nodeName": "node-1"},
}

_migration(spec) := {
	"metadata": {"namespace": "default", "name": "migration-job"},
	"spec": object.union({"vmiName": "vmi-fedora"}, spec),
}

_named(name) := {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}

_to(name) := {"addedNodeSelectorTerm": _named(name)}

_input(spec) := {"migration": _migration(spec), "vmi": _vmi, "nodes": _nodes}

# object.union merges nested objects: only patch what is meant to be merged.
_vmi_with(spec) := object.union(_vmi, {"spec": object.union(_vmi.spec, spec)})

_with_vmi_spec(spec) := {"migration": _migration(_to("node-2")), "vmi": _vmi_with(spec), "nodes": _nodes}

_with_node2(patch) := object.union(_input(_to("node-2")), {"nodes": [_nodes[0], object.union(_nodes[1], patch), _nodes[2]]})

_decide(inp) := decision if {
	decision := target.decision with input as inp
}

_reason(inp) := _decide(inp).error.reason

_message(inp) := _decide(inp).error.message

_explained(inp) := {entry.node: entry.reason | some entry in explanation.nodes} if {
	explanation := target.explanation with input as inp
}

# Design 001: the positive test and the four negative tests ----------------------------------------

test_migrates_to_the_named_node if {
	_decide(_input(_to("node-2"))) == {
		"candidateNodes": ["node-2"],
		"targetNodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_named("node-2")]}},
		"error": null,
	}
}

test_named_node_does_not_exist if {
	d := _decide(_input(_to("node-9")))
	d.candidateNodes == []
	d.error == {"reason": "NodeNotFound", "message": "migration default/migration-job: node node-9 does not exist"}
}

test_vm_already_on_the_named_node if {
	d := _decide(_input(_to("node-1")))
	d.error.reason == "AlreadyOnNode"
	d.error.message == "migration default/migration-job: VMI vmi-fedora already runs on node node-1, the only node matching the added node selector term"
}

test_named_node_conflicts_with_the_vms_node_selector if {
	inp := _with_vmi_spec({"nodeSelector": {"disktype": "hdd"}})
	_reason(inp) == "ConflictsWithVMConstraints"
	contains(_message(inp), "node-2: lacks label disktype=hdd required by the VMI's nodeSelector")
}

test_named_node_cannot_fit_the_vm if {
	inp := _with_node2({"status": {"allocatable": {"cpu": "4", "memory": "1Gi"}}})
	d := _decide(inp)
	d.candidateNodes == []
	d.error.reason == "NoCapacity"
	contains(d.error.message, "node-2: insufficient memory: the VMI requests 2Gi; 1Gi allocatable, 0 requested by pods, 1Gi free")

	# the affinity the target pod would get is still reported
	d.targetNodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == [_named("node-2")]
}

# Candidates and the pure AND ---------------------------------------------------------------------

test_without_added_constraint_every_other_node_is_a_candidate if {
	d := _decide(_input({}))
	d.candidateNodes == ["node-2", "node-3"]
	d.targetNodeAffinity == null
	d.error == null
}

test_without_added_constraint_the_vmis_affinity_is_kept if {
	affinity := {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]}}
	inp := {"migration": _migration({}), "vmi": _vmi_with({"affinity": {"nodeAffinity": affinity}}), "nodes": _nodes}
	d := _decide(inp)
	d.candidateNodes == ["node-2"]
	d.targetNodeAffinity == affinity
}

test_ored_vmi_terms_get_the_added_term_anded_into_each if {
	zone_a := {"key": "zone", "operator": "In", "values": ["a"]}
	zone_b := {"key": "zone", "operator": "In", "values": ["b"]}
	ssd := {"key": "disktype", "operator": "In", "values": ["ssd"]}
	preferred := [{"weight": 1, "preference": {"matchExpressions": [zone_b]}}]
	node_affinity := {
		"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [zone_a]}, {"matchExpressions": [zone_b]}]},
		"preferredDuringSchedulingIgnoredDuringExecution": preferred,
	}
	inp := {
		"migration": _migration({"addedNodeSelectorTerm": {"matchExpressions": [ssd]}}),
		"vmi": object.union(_vmi, {"spec": object.union(_vmi.spec, {"affinity": {"nodeAffinity": node_affinity}})}),
		"nodes": [
			_node("node-1", {"zone": "a", "disktype": "ssd"}),
			_node("node-2", {"zone": "a", "disktype": "ssd"}),
			_node("node-3", {"zone": "b", "disktype": "hdd"}),
			_node("node-4", {"zone": "b", "disktype": "ssd"}),
			_node("node-5", {"zone": "c", "disktype": "ssd"}),
		],
	}
	d := _decide(inp)
	d.candidateNodes == ["node-2", "node-4"]
	d.targetNodeAffinity == {
		"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [zone_a, ssd]},
			{"matchExpressions": [zone_b, ssd]},
		]},
		"preferredDuringSchedulingIgnoredDuringExecution": preferred,
	}
	_explained(inp)["node-5"] == "matches none of the VMI's required node affinity terms"
	_explained(inp)["node-3"] == `does not match spec.addedNodeSelectorTerm.matchExpressions[0] (disktype In ["ssd"])`
}

test_nodes_match_by_labels_and_name_together if {
	term := {
		"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}],
		"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-2"]}],
	}
	d := _decide(_input({"addedNodeSelectorTerm": term}))
	d.error.reason == "AlreadyOnNode"
}

# Term sources ------------------------------------------------------------------------------------

test_a_list_of_one_term_is_accepted if {
	_decide(_input({"addedNodeSelectorTerm": [_named("node-2")]})).candidateNodes == ["node-2"]
}

test_added_node_selector_map_is_in_requirements if {
	d := _decide(_input({"addedNodeSelector": {"disktype": "hdd"}}))
	d.candidateNodes == ["node-3"]
	d.targetNodeAffinity == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["hdd"]}]}]}}
}

test_empty_added_node_selector_adds_nothing if {
	d := _decide(_input({"addedNodeSelector": {}}))
	d.candidateNodes == ["node-2", "node-3"]
	d.targetNodeAffinity == null
}

_annotated(text) := object.union(_input({}), {"migration": {
	"metadata": {"namespace": "default", "name": "migration-job", "annotations": {"migrations.virt-rules.io/added-node-selector-term": text}},
	"spec": {"vmiName": "vmi-fedora"},
}})

test_annotation_holds_the_term_as_json if {
	_decide(_annotated(json.marshal(_named("node-3")))).candidateNodes == ["node-3"]
}

test_all_three_sources_are_anded if {
	inp := {
		"migration": {
			"metadata": {"namespace": "default", "name": "migration-job", "annotations": {"migrations.virt-rules.io/added-node-selector-term": `{"matchExpressions": [{"key": "rack", "operator": "Exists"}]}`}},
			"spec": {
				"addedNodeSelectorTerm": {"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]},
				"addedNodeSelector": {"zone": "a"},
			},
		},
		"vmi": _vmi,
		"nodes": [
			_node("node-1", {}),
			_node("node-2", {"disktype": "ssd", "zone": "a", "rack": "1"}),
			_node("node-3", {"disktype": "ssd", "zone": "b", "rack": "1"}),
			_node("node-4", {"disktype": "ssd", "zone": "a"}),
			_node("node-5", {"disktype": "hdd", "zone": "a", "rack": "1"}),
		],
	}
	d := _decide(inp)
	d.candidateNodes == ["node-2"]
	d.targetNodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == [{"matchExpressions": [
		{"key": "disktype", "operator": "In", "values": ["ssd"]},
		{"key": "rack", "operator": "Exists"},
		{"key": "zone", "operator": "In", "values": ["a"]},
	]}]
	_explained(inp)["node-3"] == `does not match spec.addedNodeSelector[zone] (zone In ["a"])`
	_explained(inp)["node-4"] == "does not match metadata.annotations[migrations.virt-rules.io/added-node-selector-term].matchExpressions[0] (rack Exists)"
}

# Design 001: "AddedNodeSelectorTerm is empty by default (all Nodes match)", and its merge appends
# nothing for an empty term: a term without requirements adds no constraint.
test_empty_term_adds_no_constraint if {
	every spec in [
		{"addedNodeSelectorTerm": {}},
		{"addedNodeSelectorTerm": [{}]},
		{"addedNodeSelectorTerm": {"matchExpressions": [], "matchFields": []}},
		{"addedNodeSelectorTerm": {}, "addedNodeSelector": {}},
	] {
		_decide(_input(spec)) == {"candidateNodes": ["node-2", "node-3"], "targetNodeAffinity": null, "error": null}
		_explained(_input(spec))["node-2"] == "candidate"
	}
}

test_empty_annotation_term_adds_no_constraint if {
	_decide(_annotated("{}")) == {"candidateNodes": ["node-2", "node-3"], "targetNodeAffinity": null, "error": null}
}

test_empty_term_keeps_the_vmis_own_affinity if {
	affinity := {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]}}
	inp := {"migration": _migration({"addedNodeSelectorTerm": {}}), "vmi": _vmi_with({"affinity": {"nodeAffinity": affinity}}), "nodes": _nodes}
	d := _decide(inp)
	d.candidateNodes == ["node-2"]
	d.targetNodeAffinity == affinity
}

test_empty_term_anded_with_a_selector_is_the_selector if {
	d := _decide(_input({"addedNodeSelectorTerm": {"matchExpressions": []}, "addedNodeSelector": {"disktype": "ssd"}}))
	d.candidateNodes == ["node-2"]
	d.targetNodeAffinity == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]}}
}

test_empty_term_does_not_claim_to_match if {
	inp := object.union(_input({"addedNodeSelectorTerm": {}}), {"nodes": [_nodes[0]]})
	_message(inp) == "migration default/migration-job: VMI vmi-fedora already runs on node node-1, the only node"
}

# Reasons -----------------------------------------------------------------------------------------

test_several_named_nodes_do_not_exist if {
	term := {"matchFields": [
		{"key": "metadata.name", "operator": "In", "values": ["node-8"]},
		{"key": "metadata.name", "operator": "In", "values": ["node-9"]},
	]}
	_message(_input({"addedNodeSelectorTerm": term})) == "migration default/migration-job: nodes node-8, node-9 do not exist"
}

test_an_existing_named_node_is_not_node_not_found if {
	term := {"matchFields": [
		{"key": "metadata.name", "operator": "In", "values": ["node-2"]},
		{"key": "metadata.name", "operator": "In", "values": ["node-9"]},
	]}
	_reason(_input({"addedNodeSelectorTerm": term})) == "NoMatchingNode"
}

test_single_node_cluster_is_already_on_node if {
	inp := object.union(_input({}), {"nodes": [_nodes[0]]})
	_message(inp) == "migration default/migration-job: VMI vmi-fedora already runs on node node-1, the only node"
}

test_no_nodes_at_all if {
	inp := object.union(_input({}), {"nodes": []})
	_message(inp) == "migration default/migration-job: there is no node"
}

test_only_cordoned_nodes_match if {
	inp := _with_node2({"spec": {"unschedulable": true}})
	d := _decide(inp)
	d.error.reason == "NoMatchingNode"
	d.error.message == "migration default/migration-job: every node that could take VMI vmi-fedora is unschedulable: node-2: cordoned (spec.unschedulable)"
}

test_unschedulable_label_and_cordon_taint if {
	_explained(_with_node2({"metadata": {"name": "node-2", "labels": {"kubevirt.io/schedulable": "false"}}}))["node-2"] == "labelled kubevirt.io/schedulable=false"
	taint := {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
	inp := _with_node2({"spec": {"taints": [taint]}})
	_explained(inp)["node-2"] == "cordoned (taint node.kubernetes.io/unschedulable)"
	_reason(inp) == "NoMatchingNode"
}

test_conflict_wins_over_cordon_when_no_node_passes_the_vm_constraints if {
	inp := {"migration": _migration({}), "vmi": _vmi_with({"nodeSelector": {"gpu": "true"}}), "nodes": _nodes}
	_reason(inp) == "ConflictsWithVMConstraints"
}

test_no_capacity_wins_over_no_matching_node if {
	nodes := [
		_nodes[0],
		object.union(_nodes[1], {"spec": {"unschedulable": true}}),
		object.union(_nodes[2], {"status": {"allocatable": {"cpu": "500m"}}}),
	]
	inp := object.union(_input({}), {"nodes": nodes})
	_reason(inp) == "NoCapacity"
	_explained(inp)["node-3"] == "insufficient cpu: the VMI requests 1; 500m allocatable, 0 requested by pods, 500m free"
}

test_long_node_lists_are_cut_short if {
	nodes := [_node(sprintf("node-%d", [i]), {}) | some i in numbers.range(1, 8)]
	inp := {"migration": _migration({}), "vmi": _vmi_with({"nodeSelector": {"gpu": "true"}}), "nodes": nodes}
	endswith(_message(inp), "node-6: lacks label gpu=true required by the VMI's nodeSelector; and 2 more")
}

test_explanation_lists_every_node_with_its_reason if {
	explanation := target.explanation with input as _input(_to("node-2"))
	explanation == {
		"nodes": [
			{"node": "node-1", "candidate": false, "reason": `does not match spec.addedNodeSelectorTerm.matchFields[0] (metadata.name In ["node-2"])`},
			{"node": "node-2", "candidate": true, "reason": "candidate"},
			{"node": "node-3", "candidate": false, "reason": `does not match spec.addedNodeSelectorTerm.matchFields[0] (metadata.name In ["node-2"])`},
		],
		"error": null,
	}
	_explained(_input({}))["node-1"] == "the VMI already runs on this node"
}

# Tolerations -------------------------------------------------------------------------------------

_tainted(taint) := _with_node2({"spec": {"taints": [taint]}})

_tolerating(taint, tolerations) := object.union(_tainted(taint), {"vmi": object.union(_vmi, {"spec": object.union(_vmi.spec, {"tolerations": tolerations})})})

test_untolerated_taints_conflict if {
	inp := _tainted({"key": "dedicated", "value": "infra", "effect": "NoSchedule"})
	_reason(inp) == "ConflictsWithVMConstraints"
	_explained(inp)["node-2"] == "has taint dedicated=infra:NoSchedule, which the VMI does not tolerate"
	_explained(_tainted({"key": "maintenance", "effect": "NoExecute"}))["node-2"] == "has taint maintenance:NoExecute, which the VMI does not tolerate"
}

test_prefer_no_schedule_taints_are_ignored if {
	_decide(_tainted({"key": "dedicated", "effect": "PreferNoSchedule"})).candidateNodes == ["node-2"]
}

test_tolerated_taints_allow_the_node if {
	taint := {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
	_decide(_tolerating(taint, [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}])).candidateNodes == ["node-2"]
	_decide(_tolerating(taint, [{"key": "other", "operator": "Exists"}, {"key": "dedicated", "operator": "Exists"}])).candidateNodes == ["node-2"]
	_decide(_tolerating(taint, [{"key": "dedicated", "operator": "Equal", "value": "other"}])).candidateNodes == []
}

test_toleration_semantics if {
	taint := {"key": "k", "value": "v", "effect": "NoSchedule"}
	target.tolerates({"key": "k", "value": "v"}, taint) # no operator means Equal
	target.tolerates({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, taint)
	not target.tolerates({"key": "k", "operator": "Equal", "value": "w"}, taint)
	target.tolerates({"key": "k", "operator": "Exists"}, taint)
	target.tolerates({"operator": "Exists"}, taint) # empty key with Exists tolerates everything
	target.tolerates({"operator": "Exists"}, {"key": "any", "effect": "NoExecute"})
	not target.tolerates({"key": "k", "operator": "Exists", "effect": "NoExecute"}, taint)
	target.tolerates({"key": "k", "operator": "Exists", "effect": ""}, taint) # empty effect: all effects
	not target.tolerates({"key": "other", "operator": "Exists"}, taint)
	not target.tolerates({"key": "k", "operator": "Near"}, taint)
	target.tolerates({"key": "k", "operator": "Equal"}, {"key": "k", "effect": "NoSchedule"}) # both values empty
}

# Host-model CPU ----------------------------------------------------------------------------------

# A required feature labelled "false" is copied as it is (prepareNodeSelectorForHostCpuModel
# copies values): node-5 has vmx=false like the source, so only it takes the VMI.
_host_model_nodes := [
	_node("node-1", {"host-model-cpu.node.kubevirt.io/Skylake": "true", "host-model-required-features.node.kubevirt.io/avx512": "true", "host-model-required-features.node.kubevirt.io/vmx": "false"}),
	_node("node-2", {"cpu-model-migration.node.kubevirt.io/Skylake": "true", "cpu-feature.node.kubevirt.io/avx512": "true"}),
	_node("node-3", {"cpu-model-migration.node.kubevirt.io/Skylake": "true"}),
	_node("node-4", {"cpu-model-migration.node.kubevirt.io/Haswell": "true", "cpu-feature.node.kubevirt.io/avx512": "true"}),
	_node("node-5", {"cpu-model-migration.node.kubevirt.io/Skylake": "true", "cpu-feature.node.kubevirt.io/avx512": "true", "cpu-feature.node.kubevirt.io/vmx": "false"}),
]

# cpu: the VMI's spec.domain.cpu; null for none (KubeVirt's webhook defaults it to host-model).
_host_model_input(cpu) := {
	"migration": _migration({}),
	"vmi": json.patch(_vmi, _cpu_patch(cpu)),
	"nodes": _host_model_nodes,
}

_cpu_patch(null) := [{"op": "remove", "path": "/spec/domain/cpu"}]

_cpu_patch(cpu) := [{"op": "replace", "path": "/spec/domain/cpu", "value": cpu}] if cpu != null

_hm := {"model": "host-model"}

test_host_model_vmi_needs_the_source_cpu_model_and_features if {
	inp := _host_model_input(_hm)
	target.cpu_labels == ["cpu-feature.node.kubevirt.io/avx512", "cpu-feature.node.kubevirt.io/vmx", "cpu-model-migration.node.kubevirt.io/Skylake"] with input as inp
	_decide(inp).candidateNodes == ["node-5"]
	_explained(inp)["node-2"] == "lacks label cpu-feature.node.kubevirt.io/vmx=false, needed for the host-model CPU of node node-1 (from its labels; the source launcher pod was not given)"
	_explained(inp)["node-3"] == "lacks label cpu-feature.node.kubevirt.io/avx512=true, needed for the host-model CPU of node node-1 (from its labels; the source launcher pod was not given)"
	_decide(_host_model_input(null)).candidateNodes == ["node-5"]
	_decide(_host_model_input({"model": ""})).candidateNodes == ["node-5"]
}

# A named model has no host-model constraint; it needs cpu-model.node.kubevirt.io/<model> instead.
test_named_cpu_model_has_no_host_model_constraint if {
	inp := _host_model_input({"model": "Haswell"})
	_decide(inp).candidateNodes == []
	_explained(inp)["node-4"] == "lacks label cpu-model.node.kubevirt.io/Haswell=true, which KubeVirt's launcher pod requires (for the VMI's CPU model)"
	haswell := json.patch(inp, [{"op": "add", "path": sprintf("/nodes/%d/metadata/labels/cpu-model.node.kubevirt.io~1Haswell", [i]), "value": "true"} | some i in numbers.range(0, 4)])
	_decide(haswell).candidateNodes == ["node-2", "node-3", "node-4", "node-5"]
	target.cpu_labels == [] with input as haswell
}

# Upstream template_test.go "should add node selector for node discovery feature to template" and
# services CPUFeatureLabelsFromCPUFeatures: a named model and each required feature (policy
# require or none) are required; disable, force and optional add nothing; forbid is a
# DoesNotExist affinity (setNodeAffinityForbiddenFeaturePolicy).
_featured_nodes := [
	_node("node-1", {}),
	_node("node-2", {"cpu-model.node.kubevirt.io/Conroe": "true", "cpu-feature.node.kubevirt.io/lahf_lm": "true", "cpu-feature.node.kubevirt.io/sse2": "true"}),
	_node("node-3", {"cpu-model.node.kubevirt.io/Conroe": "true", "cpu-feature.node.kubevirt.io/lahf_lm": "true"}),
	_node("node-4", {"cpu-model.node.kubevirt.io/Conroe": "true", "cpu-feature.node.kubevirt.io/lahf_lm": "true", "cpu-feature.node.kubevirt.io/sse2": "true", "cpu-feature.node.kubevirt.io/ssse3": "false"}),
	_node("node-5", {"cpu-feature.node.kubevirt.io/lahf_lm": "true", "cpu-feature.node.kubevirt.io/sse2": "true"}),
]

_features := [
	{"name": "lahf_lm", "policy": "require"},
	{"name": "sse2"},
	{"name": "mmx", "policy": "disable"},
	{"name": "pcid", "policy": "force"},
	{"name": "ssse3", "policy": "forbid"},
]

_featured(cpu) := object.union(_host_model_input(cpu), {"nodes": _featured_nodes})

test_named_model_and_required_features if {
	inp := _featured({"model": "Conroe", "features": _features})
	target.renderer_selector == {
		"kubevirt.io/schedulable": "true",
		"cpu-model.node.kubevirt.io/Conroe": "true",
		"cpu-feature.node.kubevirt.io/lahf_lm": "true",
		"cpu-feature.node.kubevirt.io/sse2": "true",
	} with input as inp
	target.forbidden_labels == ["cpu-feature.node.kubevirt.io/ssse3"] with input as inp
	_decide(inp).candidateNodes == ["node-2"]
	e := _explained(inp)
	e["node-3"] == "lacks label cpu-feature.node.kubevirt.io/sse2=true, which KubeVirt's launcher pod requires (for a CPU feature the VMI requires)"
	e["node-4"] == "has label cpu-feature.node.kubevirt.io/ssse3: the VMI forbids CPU feature ssse3"
	e["node-5"] == "lacks label cpu-model.node.kubevirt.io/Conroe=true, which KubeVirt's launcher pod requires (for the VMI's CPU model)"
}

# Required features are rendered with any model set, host-passthrough included. Without a model
# upstream's renderer adds none (CPUModelLabelFromCPUModel fails), but KubeVirt's webhook
# defaults the model first: virt-rules reads such a VMI as host-model, features required.
# Forbidden features apply whatever the model.
test_features_without_a_named_model if {
	passthrough := _featured({"model": "host-passthrough", "features": _features})
	_decide(passthrough).candidateNodes == ["node-2", "node-5"]
	none := _featured({"features": _features})
	_decide(none).candidateNodes == []
	target.renderer_selector == {"kubevirt.io/schedulable": "true", "cpu-feature.node.kubevirt.io/lahf_lm": "true", "cpu-feature.node.kubevirt.io/sse2": "true"} with input as none
	target.forbidden_labels == ["cpu-feature.node.kubevirt.io/ssse3", "node-labeller.kubevirt.io/obsolete-host-model"] with input as none
}

# Upstream "with CPU mode which is" Entry "host-model should be targeted only to nodes which
# support the model": prepareNodeSelectorForHostCpuModel fails without the node's
# host-model-cpu label, and no target pod is created.
test_source_without_host_model_label_takes_no_host_model_vmi if {
	inp := object.union(_host_model_input(_hm), {"nodes": array.concat([_node("node-1", {})], array.slice(_host_model_nodes, 1, 5))})
	target.host_model_unplaceable with input as inp
	_decide(inp).candidateNodes == []
	_reason(inp) == "ConflictsWithVMConstraints"
	_explained(inp)["node-2"] == "KubeVirt creates no target pod for host-model VMI vmi-fedora: node node-1 has no host-model-cpu.node.kubevirt.io/ label (the source launcher pod was not given; its nodeSelector may carry the CPU)"
	with_pod := object.union(inp, {"sourcePod": {"spec": {"nodeSelector": {"kubevirt.io/schedulable": "true"}}}})
	_explained(with_pod)["node-2"] == "KubeVirt creates no target pod for host-model VMI vmi-fedora: node node-1 has no host-model-cpu.node.kubevirt.io/ label and the source launcher pod's nodeSelector has no CPU entries"
}

# A VMI that migrated before: its launcher pod's nodeSelector carries the CPU of the node it
# first started on (node-1's Skylake, while it now runs on a Haswell node), and those entries
# bind the target, not the current node's labels.
_migrated_pod := {"spec": {"nodeSelector": {
	"kubevirt.io/schedulable": "true",
	"cpu-model-migration.node.kubevirt.io/Skylake": "true",
	"cpu-feature.node.kubevirt.io/avx512": "true",
}}}

test_host_model_cpu_comes_from_the_source_pod if {
	haswell := _node("node-1", {"host-model-cpu.node.kubevirt.io/Haswell": "true"})
	inp := object.union(_host_model_input(_hm), {
		"nodes": array.concat([haswell], array.slice(_host_model_nodes, 1, 5)),
		"sourcePod": _migrated_pod,
	})
	target.cpu_selector == {"cpu-model-migration.node.kubevirt.io/Skylake": "true", "cpu-feature.node.kubevirt.io/avx512": "true"} with input as inp
	_decide(inp).candidateNodes == ["node-2", "node-5"]
	_explained(inp)["node-3"] == "lacks label cpu-feature.node.kubevirt.io/avx512=true, needed for the host-model CPU of node node-1 (from the source launcher pod's nodeSelector)"

	# without the pod, the node's labels: Haswell
	without := object.remove(inp, ["sourcePod"])
	_decide(without).candidateNodes == ["node-4"]

	# a pod without CPU entries (the VMI never migrated): the node's labels
	plain := object.union(without, {"sourcePod": {"spec": {"nodeSelector": {"kubevirt.io/schedulable": "true"}}}})
	_decide(plain).candidateNodes == ["node-4"]
	_explained(plain)["node-2"] == "lacks label cpu-model-migration.node.kubevirt.io/Haswell=true, needed for the host-model CPU of node node-1 (from its labels, as the source launcher pod's nodeSelector has no CPU entries)"

	# a VMI not running yet: the pod's entries still apply
	idle := json.patch(inp, [{"op": "remove", "path": "/vmi/status/nodeName"}])
	_explained(idle)["node-4"] == "lacks label cpu-model-migration.node.kubevirt.io/Skylake=true, needed for the host-model CPU of node (none: the VMI is not running) (from the source launcher pod's nodeSelector)"

	# not host-model: the pod's CPU entries are not the target's business here
	_decide(object.union(inp, {"vmi": _vmi})).candidateNodes == ["node-2", "node-3", "node-4", "node-5"]
}

test_source_pod_must_be_an_object if {
	_reason(object.union(_input({}), {"sourcePod": "pod"})) == "InvalidInput"
	_message(object.union(_input({}), {"sourcePod": {"spec": {"nodeSelector": {"a": 1}}}})) == `migration default/migration-job: sourcePod.spec.nodeSelector: must be a map of strings, got {"a":1}`
}

# The VMI's node binds the target (CPU vendor, host-model CPU): without it no answer is safe.
test_source_node_not_given_is_invalid_input if {
	inp := object.union(_host_model_input({}), {"nodes": array.slice(_host_model_nodes, 1, 4)})
	_decide(inp).candidateNodes == []
	_message(inp) == "migration default/migration-job: vmi.status.nodeName: node node-1 is not among the nodes: its CPU vendor and host-model CPU, which bind the target, are unknown"
	_reason(inp) == "InvalidInput"
}

# virt-controller's createTargetPod: the target pod requires the source node's CPU vendor label,
# unless the VMI's nodeSelector names a vendor itself (upstream test "should add CPU vendor
# label from source node": Intel, AMD, none).
_vendor_nodes(source_vendor) := [
	_node("node-1", {concat("", ["cpu-vendor.node.kubevirt.io/", v]): "true" | some v in source_vendor}),
	_node("node-2", {"cpu-vendor.node.kubevirt.io/Intel": "true"}),
	_node("node-3", {"cpu-vendor.node.kubevirt.io/AMD": "true"}),
	_node("node-4", {}),
]

_vendor_input(source_vendor, spec) := {"migration": _migration({}), "vmi": _vmi_with(spec), "nodes": _vendor_nodes(source_vendor)}

test_target_needs_the_source_nodes_cpu_vendor if {
	_decide(_vendor_input({"Intel"}, {})).candidateNodes == ["node-2"]
	_decide(_vendor_input({"AMD"}, {})).candidateNodes == ["node-3"]
	_decide(_vendor_input(set(), {})).candidateNodes == ["node-2", "node-3", "node-4"]
	_explained(_vendor_input({"Intel"}, {}))["node-3"] == "lacks label cpu-vendor.node.kubevirt.io/Intel=true: KubeVirt migrates only between nodes of the CPU vendor of node node-1"
	target.kubevirt_selector == {"cpu-vendor.node.kubevirt.io/Intel": "true"} with input as _vendor_input({"Intel"}, {})
	_reason(object.union(_vendor_input({"Intel"}, {}), {"migration": _migration(_to("node-3"))})) == "ConflictsWithVMConstraints"
}

test_vmi_naming_a_vendor_keeps_its_own if {
	inp := _vendor_input({"Intel"}, {"nodeSelector": {"cpu-vendor.node.kubevirt.io/AMD": "true"}})
	target.kubevirt_selector == {} with input as inp
	_decide(inp).candidateNodes == ["node-3"]
}

test_several_vendor_labels_take_the_first if {
	_decide(_vendor_input({"Intel", "AMD"}, {})).candidateNodes == ["node-3"]
}

# services.NodeSelectorRenderer: machine-type.node.kubevirt.io/<type>, status.machine.type taking
# precedence over spec.domain.machine.type (upstream test "should add node selector for machine type").
_machine_nodes := [
	_node("node-1", {}),
	_node("node-2", {"machine-type.node.kubevirt.io/q35": "true"}),
	_node("node-3", {"machine-type.node.kubevirt.io/pc-q35-rhel9.6.0": "true", "machine-type.node.kubevirt.io/q35": "false"}),
]

_machine_input(spec_type, status_type) := {"migration": _migration({}), "vmi": object.union(_vmi_with({"domain": object.union(_vmi.spec.domain, {"machine": {"type": spec_type}})}), {"status": {"machine": {"type": status_type}}}), "nodes": _machine_nodes}

test_target_needs_the_vmis_machine_type if {
	_decide(_machine_input("q35", "")).candidateNodes == ["node-2"]
	_decide(_machine_input("q35", "pc-q35-rhel9.6.0")).candidateNodes == ["node-3"]
	_explained(_machine_input("q35", ""))["node-3"] == "lacks label machine-type.node.kubevirt.io/q35=true: KubeVirt's target pod requires the VMI's machine type q35"
	_decide(_machine_input("", "")).candidateNodes == ["node-2", "node-3"]
	_reason(object.union(_machine_input("q35", ""), {"migration": _migration(_to("node-3"))})) == "ConflictsWithVMConstraints"
}

test_machine_type_must_be_a_string if {
	inp := _machine_input(7, "")
	_reason(inp) == "InvalidInput"
	contains(_message(inp), "vmi.spec.domain.machine.type: must be a string, got 7")
}

# Capacity and pods -------------------------------------------------------------------------------

_pod(node, phase, requests) := {"spec": {"nodeName": node, "containers": [{"resources": {"requests": r}} | some r in requests]}, "status": {"phase": phase}}

test_pods_on_the_node_use_its_capacity if {
	pods := [_pod("node-2", "Running", [{"cpu": "2", "memory": "4Gi"}, {"cpu": "500m"}]), _pod("node-2", "Pending", [{"memory": "3Gi"}])]
	inp := object.union(_input(_to("node-2")), {"pods": pods})
	d := _decide(inp)
	d.error.reason == "NoCapacity"
	contains(d.error.message, "node-2: insufficient memory: the VMI requests 2Gi; 8Gi allocatable, 7Gi requested by pods, 1Gi free")
	not contains(d.error.message, "insufficient cpu")
	pods2 := [_pod("node-2", "Running", [{"cpu": "2", "memory": "4Gi"}, {"cpu": "1500m"}])]
	_explained(object.union(_input(_to("node-2")), {"pods": pods2}))["node-2"] == "insufficient cpu: the VMI requests 1; 4 allocatable, 3500m requested by pods, 500m free"
}

test_terminated_pods_and_pods_elsewhere_do_not_count if {
	pods := [
		_pod("node-2", "Succeeded", [{"cpu": "4", "memory": "8Gi"}]),
		_pod("node-2", "Failed", [{"cpu": "4", "memory": "8Gi"}]),
		_pod("node-3", "Running", [{"cpu": "4", "memory": "8Gi"}]),
		{"spec": {"containers": [{"resources": {"requests": {"cpu": "4"}}}]}}, # not scheduled yet
		_pod("node-2", "Running", [{"cpu": "3", "memory": "6Gi"}]), # leaves exactly the VMI's requests
	]
	_decide(object.union(_input(_to("node-2")), {"pods": pods})).candidateNodes == ["node-2"]
}

test_fit_is_skipped_without_allocatable if {
	inp := object.union(_input(_to("node-2")), {
		"nodes": [_nodes[0], {"metadata": {"name": "node-2", "labels": {"kubevirt.io/schedulable": "true"}}}],
		"pods": [_pod("node-2", "Running", [{"cpu": "400"}])],
	})
	_decide(inp).candidateNodes == ["node-2"]
}

test_vmi_without_requests_always_fits if {
	inp := object.union(_input(_to("node-2")), {"vmi": {"metadata": {"name": "vmi-fedora"}, "status": {"nodeName": "node-1"}}})
	_decide(inp).candidateNodes == ["node-2"]
}

# What kube-scheduler counts for a pod (k8s.io/component-helpers resource.PodRequests, the
# cases of its TestPodResourceRequests, in these fixtures' own numbers).
_container(cpu) := {"resources": {"requests": {"cpu": cpu}}}

_sidecar(cpu) := object.union(_container(cpu), {"restartPolicy": "Always"})

_cpu_of(spec) := target.pod_request({"spec": spec}, "cpu")

test_pod_request_follows_the_scheduler if {
	# the larger of the containers' sum and the largest init container
	_cpu_of({"containers": [_container("1")], "initContainers": [_container("3")]}) == 3000
	_cpu_of({"containers": [_container("1"), _container("2")], "initContainers": [_container("2")]}) == 3000

	# spec.overhead adds
	_cpu_of({"containers": [_container("1")], "initContainers": [_container("3")], "overhead": {"cpu": "250m"}}) == 3250
	target.pod_request({"spec": {"overhead": {"memory": "1Gi"}}}, "memory") == 1073741824

	# a sidecar (restartable init container) runs beside the containers: it adds
	_cpu_of({"containers": [_container("1")], "initContainers": [_sidecar("1")]}) == 2000

	# an init container runs beside the sidecars started before it, not those after it
	_cpu_of({"containers": [_container("1")], "initContainers": [_container("4"), _sidecar("1"), _sidecar("2"), _container("4"), _sidecar("3")]}) == 7000
	_cpu_of({"containers": [_container("50")], "initContainers": [_sidecar("5"), _container("100")]}) == 105000

	# a pod-level request replaces the containers' for its resource (PodLevelResources)
	pod_level := {"containers": [_container("1")], "resources": {"requests": {"cpu": "3"}}, "overhead": {"cpu": "1"}}
	_cpu_of(pod_level) == 4000
	target.pod_request({"spec": object.union(pod_level, {"containers": [{"resources": {"requests": {"memory": "1Gi"}}}]})}, "memory") == 1073741824

	# nothing requested: 0
	_cpu_of({}) == 0
	_cpu_of({"containers": [{"name": "c"}], "initContainers": [{"name": "i"}]}) == 0
}

test_pods_count_init_containers_and_overhead if {
	# 1 CPU of containers, but a 3 CPU init container and 500m overhead: 3500m of node-2's 4
	pod := {"spec": {"nodeName": "node-2", "containers": [_container("1")], "initContainers": [_container("3")], "overhead": {"cpu": "500m"}}}
	inp := object.union(_input(_to("node-2")), {"pods": [pod]})
	_explained(inp)["node-2"] == "insufficient cpu: the VMI requests 1; 4 allocatable, 3500m requested by pods, 500m free"
	_decide(object.union(inp, {"pods": [json.remove(pod, ["spec/overhead"])]})).candidateNodes == ["node-2"]
}

# The target pod is rendered from the VMI as the source launcher pod was: its requests, with
# KubeVirt's memory overhead in the compute container, are the target's.
_launcher := {"spec": {
	"nodeName": "node-1",
	"containers": [{"name": "compute", "resources": {"requests": {"cpu": "1", "memory": "2330Mi"}}}],
	"initContainers": [{"name": "guest-console-log", "restartPolicy": "Always", "resources": {"requests": {"cpu": "5m", "memory": "35M"}}}],
}}

test_the_launcher_pod_requests_are_the_target_pods if {
	# node-2 has 2304Mi free: the VMI's 2Gi fit, the launcher pod's 2330Mi + 35M do not
	pods := [_pod("node-2", "Running", [{"memory": "5Gi"}]), _pod("node-2", "Running", [{"memory": "768Mi"}])]
	inp := object.union(_input(_to("node-2")), {"pods": pods})
	_decide(inp).candidateNodes == ["node-2"]
	with_pod := object.union(inp, {"sourcePod": _launcher})
	_reason(with_pod) == "NoCapacity"
	_message(with_pod) == "migration default/migration-job: no node has room for VMI vmi-fedora: node-2: insufficient memory: the launcher pod requests 2478182080; 8Gi allocatable, 5888Mi requested by pods, 2304Mi free"

	# CPU: 1005m of 1 free
	cpu_pods := [_pod("node-2", "Running", [{"cpu": "3"}])]
	_explained(object.union(inp, {"pods": cpu_pods, "sourcePod": _launcher}))["node-2"] == "insufficient cpu: the launcher pod requests 1005m; 4 allocatable, 3 requested by pods, 1 free"
}

test_without_the_launcher_pod_the_overhead_is_not_counted if {
	pods := [_pod("node-2", "Running", [{"memory": "7Gi"}])]
	_message(object.union(_input(_to("node-2")), {"pods": pods})) == "migration default/migration-job: no node has room for VMI vmi-fedora: node-2: insufficient memory: the VMI requests 2Gi; 8Gi allocatable, 7Gi requested by pods, 1Gi free (KubeVirt's launcher overhead is not counted: the source launcher pod was not given)"
}

test_a_request_of_zero_is_not_checked if {
	# the scheduler checks a resource only when the pod requests more than 0 of it
	full := object.union(_input(_to("node-2")), {"pods": [_pod("node-2", "Running", [{"cpu": "5"}])]})
	_decide(object.union(full, {"vmi": _vmi_with({"domain": {"resources": {"requests": {"cpu": "0", "memory": "1Gi"}}}})})).candidateNodes == ["node-2"]
	_decide(object.union(full, {"sourcePod": {"spec": {"containers": [{"resources": {"requests": {"memory": "1Gi"}}}]}}})).candidateNodes == ["node-2"]
}

# KubeVirt's launcher pod asks for its device plugins' resources; kube-scheduler's fit plugin
# finds none on a node that does not list them (the test cluster's scheduler refused a node
# without devices.kubevirt.io/kvm, test/scheduler).
_kvm_launcher := {"spec": {"nodeName": "node-1", "containers": [{"name": "compute", "resources": {"requests": {
	"cpu": "1", "memory": "2Gi",
	"devices.kubevirt.io/kvm": "1", "devices.kubevirt.io/tun": "1",
}}}]}}

test_extended_resources_the_launcher_pod_requests_are_checked if {
	inp := object.union(_input(_to("node-2")), {"sourcePod": _kvm_launcher})
	_reason(inp) == "NoCapacity"
	_explained(inp)["node-2"] == "insufficient devices.kubevirt.io/kvm: the launcher pod requests 1; none allocatable, 0 requested by pods, 0 free; insufficient devices.kubevirt.io/tun: the launcher pod requests 1; none allocatable, 0 requested by pods, 0 free"
	with_devices := {"status": {"allocatable": {"cpu": "4", "memory": "8Gi", "devices.kubevirt.io/kvm": "1", "devices.kubevirt.io/tun": "1k"}}}
	devices := object.union(_with_node2(with_devices), {"sourcePod": _kvm_launcher})
	_decide(devices).candidateNodes == ["node-2"]
	kvm_used := object.union(devices, {"pods": [_pod("node-2", "Running", [{"devices.kubevirt.io/kvm": "1"}])]})
	_explained(kvm_used)["node-2"] == "insufficient devices.kubevirt.io/kvm: the launcher pod requests 1; 1 allocatable, 1 requested by pods, 0 free"
}

test_what_every_kubelet_reports_is_checked_only_when_listed if {
	# a node manifest written by hand may leave out cpu or pods: unknown, not none
	memory_only := _with_node2({"status": {"allocatable": {"cpu": null}}})
	_decide(object.union(memory_only, {"nodes": [_nodes[0], {"metadata": _nodes[1].metadata, "status": {"allocatable": {"memory": "8Gi"}}}, _nodes[2]]})).candidateNodes == ["node-2"]
}

test_a_node_takes_no_pod_beyond_its_allocatable_pods if {
	two := {"status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "2"}}}
	one_pod := object.union(_with_node2(two), {"pods": [_pod("node-2", "Running", [{"cpu": "1"}])]})
	_decide(one_pod).candidateNodes == ["node-2"]
	pods := [_pod("node-2", "Running", []), _pod("node-2", "Pending", []), _pod("node-2", "Succeeded", [])]
	full := object.union(_with_node2(two), {"pods": pods})
	_reason(full) == "NoCapacity"
	_explained(full)["node-2"] == "too many pods: 2 allocatable, 2 pods on the node"
	none := _with_node2({"status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "0"}}})
	_explained(none)["node-2"] == "too many pods: 0 allocatable, 0 pods on the node"
}

test_every_allocatable_amount_must_be_a_quantity if {
	inp := _with_node2({"status": {"allocatable": {"cpu": "4", "memory": "8Gi", "devices.kubevirt.io/kvm": "plenty"}}})
	_reason(inp) == "InvalidInput"
	contains(_message(inp), `nodes[1].status.allocatable.devices.kubevirt.io/kvm: must be a quantity such as "500m" or "1Gi", got "plenty"`)
	launcher := {"spec": {"containers": [{"resources": {"requests": {"devices.kubevirt.io/kvm": true}}}]}}
	contains(_message(object.union(_input(_to("node-2")), {"sourcePod": launcher})), "sourcePod.spec.containers[0].resources.requests.devices.kubevirt.io/kvm: must be a quantity")
}

test_what_the_renderer_derives_from_the_vmi_comes_from_the_source_pod if {
	derived := {
		"kubevirt.io/cpumanager": "true", "hyperv.node.kubevirt.io/vapic": "true",
		"scheduling.node.kubevirt.io/tsc-frequency-2400000000": "true",
		# a previous migration's addedNodeSelector: not the new migration's
		"rack": "r1",
	}
	pod := {"spec": {"nodeName": "node-1", "nodeSelector": derived}}
	inp := object.union(_input(_to("node-2")), {"sourcePod": pod})
	_explained(inp)["node-2"] == "lacks label hyperv.node.kubevirt.io/vapic=true, which KubeVirt's launcher pod requires (for what the VMI asks of its node (dedicated CPUs, Hyper-V, TSC frequency, realtime or confidential computing), as the source launcher pod's nodeSelector says)"
	labelled := object.union(_nodes[1], {"metadata": {"labels": {
		"kubevirt.io/cpumanager": "true", "hyperv.node.kubevirt.io/vapic": "true",
		"scheduling.node.kubevirt.io/tsc-frequency-2400000000": "true",
	}}})
	_decide(object.union(inp, {"nodes": [_nodes[0], labelled, _nodes[2]]})).candidateNodes == ["node-2"]
}

_kubevirt_selecting(selectors) := {"spec": {"configuration": {"developerConfiguration": {"nodeSelectors": selectors}}}}

test_the_kubevirt_crs_node_selectors_go_on_the_target_pod if {
	inp := object.union(_input(_to("node-2")), {"kubevirt": _kubevirt_selecting({"virt-rules.test/pool": "vms"})})
	_reason(inp) == "ConflictsWithVMConstraints"
	_explained(inp)["node-2"] == "lacks label virt-rules.test/pool=vms, which KubeVirt's launcher pod requires (as the KubeVirt CR's developerConfiguration.nodeSelectors say)"
	labelled := object.union(_nodes[1], {"metadata": {"labels": {"virt-rules.test/pool": "vms"}}})
	_decide(object.union(inp, {"nodes": [_nodes[0], labelled, _nodes[2]]})).candidateNodes == ["node-2"]

	# the VMI's own nodeSelector overrides the cluster's entry
	own := _vmi_with({"nodeSelector": {"virt-rules.test/pool": "gpu"}})
	gpu := object.union(_nodes[1], {"metadata": {"labels": {"virt-rules.test/pool": "gpu"}}})
	_decide(object.union(inp, {"vmi": own, "nodes": [_nodes[0], gpu, _nodes[2]]})).candidateNodes == ["node-2"]

	# without the CR nothing is required
	_decide(_input(_to("node-2"))).candidateNodes == ["node-2"]
}

test_a_malformed_kubevirt_cr_is_invalid_input if {
	_reason(object.union(_input(_to("node-2")), {"kubevirt": "hello"})) == "InvalidInput"
	bad := object.union(_input(_to("node-2")), {"kubevirt": _kubevirt_selecting(["a"])})
	contains(_message(bad), "kubevirt.spec.configuration.developerConfiguration.nodeSelectors: must be a map of strings")
}

# Target pod node affinity -----------------------------------------------------------------------

_pod_affinity(spec, node_affinity) := got if {
	got := target.pod_node_affinity with input as {"migration": _migration(spec), "nodeAffinity": node_affinity}
}

test_pod_affinity_without_own_affinity_is_the_added_term if {
	_pod_affinity(_to("node-2"), null) == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_named("node-2")]}}
}

test_pod_affinity_ands_the_term_into_every_pod_term if {
	own := {
		"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
			{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
		]},
		"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}],
	}
	got := _pod_affinity(_to("node-2"), own)
	got.preferredDuringSchedulingIgnoredDuringExecution == own.preferredDuringSchedulingIgnoredDuringExecution
	every term in got.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms {
		term.matchFields == _named("node-2").matchFields
	}
	[term.matchExpressions[0].values[0] | some term in got.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms] == ["a", "b"]
}

test_pod_affinity_is_null_without_an_added_requirement if {
	_pod_affinity({}, null) == null
	_pod_affinity({"addedNodeSelectorTerm": {}}, {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}) == null
}

test_pod_affinity_reports_an_invalid_term if {
	got := _pod_affinity({"addedNodeSelectorTerm": {"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}}, null)
	contains(got.error, "matchFields[0].key")
}

# KubeVirt's NodeSelectorRenderer (services/nodeselectorrenderer.go; its test "the node requires the
# KubeVirt schedulable label") puts kubevirt.io/schedulable=true in every launcher pod's nodeSelector.
test_a_node_without_the_schedulable_label_conflicts if {
	unlabelled := {"metadata": {"name": "node-2", "labels": {"disktype": "ssd"}}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}
	inp := object.union(_input(_to("node-2")), {"nodes": [_nodes[0], unlabelled, _nodes[2]]})
	_reason(inp) == "ConflictsWithVMConstraints"
	_explained(inp)["node-2"] == "lacks label kubevirt.io/schedulable=true, which KubeVirt's launcher pod requires (NodeSelectorRenderer adds it to every launcher pod)"
	target.renderer_selector == {"kubevirt.io/schedulable": "true"} with input as inp
}

test_a_node_with_another_schedulable_value_conflicts if {
	_explained(_with_node2({"metadata": {"labels": {"kubevirt.io/schedulable": "yes"}}}))["node-2"] == "lacks label kubevirt.io/schedulable=true, which KubeVirt's launcher pod requires (NodeSelectorRenderer adds it to every launcher pod)"
}

test_schedulable_false_stays_unschedulable if {
	inp := _with_node2({"metadata": {"labels": {"kubevirt.io/schedulable": "false"}}})
	_reason(inp) == "NoMatchingNode"
}

test_the_source_pods_schedulable_value_is_taken if {
	inp := object.union(_input(_to("node-2")), {"sourcePod": {"spec": {"nodeSelector": {"kubevirt.io/schedulable": "yes"}}}})
	target.renderer_selector == {"kubevirt.io/schedulable": "yes"} with input as inp
	_explained(inp)["node-2"] == "lacks label kubevirt.io/schedulable=yes, which KubeVirt's launcher pod requires (as the source launcher pod's nodeSelector says)"
}

test_the_vmis_nodeselector_overrides_the_schedulable_default if {
	inp := _with_vmi_spec({"nodeSelector": {"kubevirt.io/schedulable": "yes"}})
	target.renderer_selector == {} with input as inp
	_explained(inp)["node-2"] == "lacks label kubevirt.io/schedulable=yes required by the VMI's nodeSelector"
}

# NewNodeSelectorRenderer (nodeselectorrenderer_test.go "requires the renderer to have applied
# the architecture to the node selectors"): kubernetes.io/arch is the VMI's architecture in lower
# case; the VMI's nodeSelector overrides it; the source launcher pod's value is taken.
test_the_vmis_architecture_is_required if {
	inp := _with_node2({"metadata": {"labels": {"kubernetes.io/arch": "arm64"}}})
	arch := json.patch(inp, [{"op": "add", "path": "/vmi/spec/architecture", "value": "ARM64"}])
	target.renderer_selector == {"kubevirt.io/schedulable": "true", "kubernetes.io/arch": "arm64"} with input as arch
	_decide(arch).candidateNodes == ["node-2"]
	amd := json.patch(inp, [{"op": "add", "path": "/vmi/spec/architecture", "value": "amd64"}])
	_explained(amd)["node-2"] == "lacks label kubernetes.io/arch=amd64, which KubeVirt's launcher pod requires (for the VMI's spec.architecture)"
	pinned := json.patch(amd, [{"op": "add", "path": "/vmi/spec/nodeSelector", "value": {"kubernetes.io/arch": "arm64"}}])
	target.renderer_selector == {"kubevirt.io/schedulable": "true"} with input as pinned
	_decide(pinned).candidateNodes == ["node-2"]
	from_pod := object.union(inp, {"sourcePod": {"spec": {"nodeSelector": {"kubevirt.io/schedulable": "true", "kubernetes.io/arch": "s390x"}}}})
	target.renderer_selector == {"kubevirt.io/schedulable": "true", "kubernetes.io/arch": "s390x"} with input as from_pod
	_explained(from_pod)["node-2"] == "lacks label kubernetes.io/arch=s390x, which KubeVirt's launcher pod requires (as the source launcher pod's nodeSelector says)"
}

# template_test.go "should add affinity to pod of vmi host model" (host-model, "" and nil):
# DoesNotExist on node-labeller.kubevirt.io/obsolete-host-model; a named model has none.
test_host_model_avoids_nodes_with_an_obsolete_host_model if {
	obsolete := {"metadata": {"labels": {"node-labeller.kubevirt.io/obsolete-host-model": "true"}}}
	inp := object.union(_host_model_input(_hm), {"nodes": [_host_model_nodes[0], object.union(_host_model_nodes[4], obsolete)]})
	target.forbidden_labels == ["node-labeller.kubevirt.io/obsolete-host-model"] with input as inp
	_explained(inp)["node-5"] == "has label node-labeller.kubevirt.io/obsolete-host-model: KubeVirt's launcher pod of a host-model VMI avoids a node whose host-model CPU is obsolete"
	_reason(inp) == "ConflictsWithVMConstraints"
	target.forbidden_labels == [] with input as json.patch(inp, [{"op": "replace", "path": "/vmi/spec/domain/cpu", "value": {"model": "host-passthrough"}}])
	target.forbidden_labels == ["node-labeller.kubevirt.io/obsolete-host-model"] with input as json.patch(inp, [{"op": "remove", "path": "/vmi/spec/domain/cpu"}])
}

# The shape: what the decision reads of a VMI and its launcher pod, their names aside.
_shape_vmi(name, cpu) := {
	"metadata": {"namespace": "prod", "name": name, "uid": name, "labels": {"kubevirt.io/domain": name}},
	"spec": {"nodeSelector": {"zone": "a"}, "domain": {"cpu": {"model": "host-model"}, "resources": {"requests": {"cpu": cpu}}, "devices": {"disks": [{"name": name}]}}},
	"status": {"nodeName": "node-1", "phase": "Running", "interfaces": [{"ipAddress": name}]},
}

_shape_pod(name, cpu) := {
	"metadata": {"name": sprintf("virt-launcher-%s-x", [name])},
	"spec": {
		"nodeSelector": {"zone": "a"},
		"containers": [{"name": "compute", "image": "launcher", "command": [name], "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}],
		"initContainers": [{"name": "init", "restartPolicy": "Always", "resources": {"requests": {"cpu": "10m"}}}, "not a container"],
	},
}

test_vmis_alike_but_for_their_names_have_one_shape if {
	a := target.shape(_shape_vmi("a", "1"), _shape_pod("a", "1"))
	a == target.shape(_shape_vmi("b", "1"), _shape_pod("b", "1"))
	a.vmi == {"spec": {"nodeSelector": {"zone": "a"}, "domain": {"cpu": {"model": "host-model"}, "resources": {"requests": {"cpu": "1"}}}}, "status": {"nodeName": "node-1"}}
	a.sourcePod.spec.containers == [{"resources": {"requests": {"cpu": "1"}}}]
	a.sourcePod.spec.initContainers == [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "10m"}}}, "not a container"]
	a != target.shape(_shape_vmi("b", "2"), _shape_pod("b", "1"))
	a != target.shape(_shape_vmi("b", "1"), _shape_pod("b", "2"))
}

test_a_shape_keeps_what_is_not_an_object_for_the_checks_to_name if {
	target.shape("vmi", null) == {"vmi": {}, "sourcePod": null}
	target.shape({}, {"spec": "none"}) == {"vmi": {}, "sourcePod": {"spec": "none"}}
	target.shape({}, {"spec": {"containers": "none"}}).sourcePod == {"spec": {"containers": "none"}}
	input_errors := target.input_errors with input as object.union(_input({}), {"sourcePod": {"spec": {"containers": "none"}}})
	"sourcePod.spec.containers: must be a list of objects, got \"none\"" in input_errors
}
