package virtrules.migration.drain_test

import data.virtrules.migration.drain

# Fixtures -----------------------------------------------------------------------------------

_node(name, cpu, memory) := {
	"metadata": {"name": name, "labels": {"kubevirt.io/schedulable": "true"}},
	"status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
}

_nodes := [_node("node-1", "4", "8Gi"), _node("node-2", "4", "8Gi"), _node("node-3", "8", "16Gi")]

# host-passthrough: no host-model CPU requirement, so that the nodes need no CPU labels.
_vmi(name, node, strategy, migratable) := {
	"metadata": {"namespace": "prod", "name": name},
	"spec": object.union(
		{"domain": {"cpu": {"model": "host-passthrough"}, "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}},
		_strategy_field(strategy),
	),
	"status": {"nodeName": node, "phase": "Running", "conditions": [_condition(migratable)]},
}

_strategy_field("") := {}

_strategy_field(strategy) := {"evictionStrategy": strategy} if strategy != ""

_condition(true) := {"type": "LiveMigratable", "status": "True"}

_condition(false) := {"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable", "message": "PVC data is not shared live migratable"}

_evacuees(vmis, kubevirt) := evacuees if {
	evacuees := drain.evacuees with input as {"drain": {"nodes": ["node-1"]}, "vmis": vmis, "kubevirt": kubevirt}
}

_actions(evacuees) := [[e.vmi, e.evictionStrategy, e.action, e.reason] | some e in evacuees]

# Evacuees -----------------------------------------------------------------------------------

test_each_strategy_has_its_outcome if {
	vmis := [
		_vmi("a-live", "node-1", "LiveMigrate", true),
		_vmi("b-pinned", "node-1", "LiveMigrate", false),
		_vmi("c-maybe", "node-1", "LiveMigrateIfPossible", true),
		_vmi("d-maybe-not", "node-1", "LiveMigrateIfPossible", false),
		_vmi("e-none", "node-1", "None", true),
		_vmi("f-external", "node-1", "External", true),
		_vmi("g-elsewhere", "node-2", "LiveMigrate", true),
	]
	_actions(_evacuees(vmis, null)) == [
		["prod/a-live", "LiveMigrate", "migrate", ""],
		["prod/b-pinned", "LiveMigrate", "stuck", "NotLiveMigratable"],
		["prod/c-maybe", "LiveMigrateIfPossible", "migrate", ""],
		["prod/d-maybe-not", "LiveMigrateIfPossible", "shutdown", "NotLiveMigratable"],
		["prod/e-none", "None", "shutdown", "EvictionStrategyNone"],
		["prod/f-external", "External", "external", "EvictionStrategyExternal"],
	]
}

test_a_stuck_vmi_says_kubevirts_reason if {
	[e] := _evacuees([_vmi("pinned", "node-1", "LiveMigrate", false)], null)
	e.message == "evictionStrategy LiveMigrate, not live-migratable (LiveMigratable False, DisksNotLiveMigratable): PVC data is not shared live migratable: KubeVirt refuses the eviction, and the drain cannot finish"
}

test_without_a_condition_a_vmi_is_not_migratable if {
	vmi := object.union(_vmi("new", "node-1", "LiveMigrate", true), {"status": {"conditions": []}})
	[e] := _evacuees([vmi], null)
	e.action == "stuck"
	contains(e.message, "LiveMigratable Unknown): the VMI has no LiveMigratable condition")
}

test_the_strategy_is_the_vmis_else_the_clusters_else_none if {
	kubevirt := {"spec": {"configuration": {"evictionStrategy": "LiveMigrate"}}}
	own := _vmi("own", "node-1", "None", true)
	inherited := _vmi("inherited", "node-1", "", true)
	_actions(_evacuees([own, inherited], kubevirt)) == [
		["prod/inherited", "LiveMigrate", "migrate", ""],
		["prod/own", "None", "shutdown", "EvictionStrategyNone"],
	]
	_actions(_evacuees([inherited], null)) == [["prod/inherited", "None", "shutdown", "EvictionStrategyNone"]]
	_actions(_evacuees([inherited], {"spec": {}})) == [["prod/inherited", "None", "shutdown", "EvictionStrategyNone"]]
}

test_an_unknown_strategy_is_stuck_not_guessed if {
	[e] := _evacuees([_vmi("odd", "node-1", "Whenever", true)], null)
	[e.action, e.reason] == ["stuck", "UnknownEvictionStrategy"]
}

test_vmis_going_anyway_are_not_evacuees if {
	done := object.union(_vmi("done", "node-1", "LiveMigrate", true), {"status": {"phase": "Succeeded"}})
	deleting := object.union(_vmi("deleting", "node-1", "LiveMigrate", true), {"metadata": {"deletionTimestamp": "2026-12-01T00:00:00Z"}})
	_evacuees([done, deleting], null) == []
}

test_a_vmi_to_migrate_has_its_shape if {
	pod := {"metadata": {"name": "virt-launcher-a-x"}, "spec": {"containers": [{"name": "compute", "resources": {"requests": {"cpu": "1"}}}]}}
	vmis := [_vmi("a", "node-1", "LiveMigrate", true), _vmi("off", "node-1", "None", true)]
	evacuees := drain.evacuees with input as {"drain": {"nodes": ["node-1"]}, "vmis": vmis, "sourcePods": {"prod/a": pod}}
	evacuees[0].shape == {"vmi": json.filter(vmis[0], ["spec/domain", "status/nodeName"]), "sourcePod": {"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}}}
	not "shape" in object.keys(evacuees[1])
}

test_evacuees_are_ordered_by_node_then_name if {
	vmis := [_vmi("z", "node-1", "None", true), _vmi("a", "node-2", "None", true), _vmi("m", "node-1", "None", true)]
	evacuees := drain.evacuees with input as {"drain": {"nodes": ["node-2", "node-1"]}, "vmis": vmis}
	[[e.node, e.vmi] | some e in evacuees] == [["node-1", "prod/m"], ["node-1", "prod/z"], ["node-2", "prod/a"]]
}

# Placement ----------------------------------------------------------------------------------

# The engine's placement input: the target decision's, the drained nodes cordoned.
_cordon(node) := object.union(node, {"spec": {"unschedulable": true}})

_migration(vmi) := {"metadata": {"namespace": "prod", "name": vmi.metadata.name}, "spec": {"vmiName": vmi.metadata.name}}

_placement(vmi, nodes, pods) := placement if {
	placement := drain.placement with input as {"migration": _migration(vmi), "vmi": vmi, "nodes": nodes, "pods": pods}
}

_place(vmi, pods) := _placement(vmi, [_cordon(_nodes[0]), _nodes[1], _nodes[2]], pods)

_pod(name, node, cpu, memory) := {
	"metadata": {"namespace": "prod", "name": name},
	"spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
}

test_the_drained_nodes_are_cordoned_and_the_freest_candidate_wins if {
	# node-3 is twice node-2's size: left freer, it wins.
	p := _place(_vmi("a", "node-1", "LiveMigrate", true), [])
	p == {
		"targetNode": "node-3", "candidateNodes": ["node-2", "node-3"], "requested": {"cpu": 1000, "memory": 2147483648},
		"scores": [[150, "node-2"], [175, "node-3"]], "error": null,
	}
}

test_candidates_scored_before_are_kept_beside_the_nodes_asked_about if {
	# Only node-2 is asked about again (it took a VMI); node-3 is handed over as scored before.
	nodes := [_cordon(_nodes[0]), _nodes[1]]
	p := drain.placement with input as {
		"migration": _migration(_vmi("b", "node-1", "LiveMigrate", true)),
		"vmi": _vmi("b", "node-1", "LiveMigrate", true), "nodes": nodes,
		"pods": [_pod("a-target", "node-2", "4", "6Gi")], "scored": [[175, "node-3"]],
	}
	p.candidateNodes == ["node-3"]
	p.targetNode == "node-3"
	p.scores == [[175, "node-3"]]
}

test_a_candidate_asked_about_again_can_win if {
	nodes := [_cordon(_nodes[0]), _nodes[1]]
	p := drain.placement with input as {
		"migration": _migration(_vmi("b", "node-1", "LiveMigrate", true)),
		"vmi": _vmi("b", "node-1", "LiveMigrate", true), "nodes": nodes, "scored": [[100, "node-3"]],
	}
	p.candidateNodes == ["node-2", "node-3"]
	p.targetNode == "node-2"
}

test_capacity_taken_moves_the_choice if {
	# node-3 half full (4 of 8 CPUs, 12 of 16Gi): node-2 is freer now.
	p := _place(_vmi("a", "node-1", "LiveMigrate", true), [_pod("busy", "node-3", "4", "12Gi")])
	p.targetNode == "node-2"
}

test_a_tie_goes_to_the_first_name if {
	nodes := [_cordon(_node("node-1", "4", "8Gi")), _node("node-b", "4", "8Gi"), _node("node-a", "4", "8Gi")]
	p := _placement(_vmi("a", "node-1", "LiveMigrate", true), nodes, [])
	p.targetNode == "node-a"
}

test_a_node_without_allocatable_scores_nothing if {
	bare := {"metadata": {"name": "node-bare", "labels": {"kubevirt.io/schedulable": "true"}}}
	nodes := [_cordon(_node("node-1", "4", "8Gi")), bare, _node("node-2", "4", "8Gi")]
	p := _placement(_vmi("a", "node-1", "LiveMigrate", true), nodes, [])
	p.targetNode == "node-2"
	p.candidateNodes == ["node-2", "node-bare"]
}

test_no_room_is_the_target_decisions_reason if {
	full := [_pod("x", "node-2", "4", "8Gi"), _pod("y", "node-3", "8", "16Gi")]
	p := _place(_vmi("a", "node-1", "LiveMigrate", true), full)
	p.targetNode == ""
	p.candidateNodes == []
	p.requested == {}
	p.error.reason == "NoCapacity"
	contains(p.error.message, "no node has room for VMI a")
}

test_only_cordoned_nodes_left_is_no_matching_node if {
	p := _placement(_vmi("a", "node-1", "LiveMigrate", true), [_cordon(n) | some n in _nodes], [])
	p.error.reason == "NoMatchingNode"
	contains(p.error.message, "cordoned (spec.unschedulable)")
}

test_a_resource_the_node_has_none_of_scores_nothing if {
	# The VMI asks for no CPU, so a node without CPU fits it: its CPU share is 0, not a
	# division by zero, and its memory share alone ranks it.
	vmi := json.patch(_vmi("a", "node-1", "LiveMigrate", true), [{"op": "replace", "path": "/spec/domain/resources/requests/cpu", "value": "0"}])
	nodes := [_cordon(_node("node-1", "4", "8Gi")), _node("node-none", "0", "64Gi"), _node("node-2", "4", "8Gi")]
	p := _placement(vmi, nodes, [])
	p.candidateNodes == ["node-2", "node-none"]
	p.targetNode == "node-2"
}
