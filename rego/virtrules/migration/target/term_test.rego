package virtrules.migration.target_test

import data.virtrules.migration.target

# Operators ---------------------------------------------------------------------------------------

_node_with(labels) := {"metadata": {"name": "node-2", "labels": labels}}

# Whether a node with labels meets a requirement given as in a matchExpressions list.
_expression_holds(requirement, labels) if {
	[req] := target.requirements_of({"origin": "term", "path": "t", "term": {"matchExpressions": [requirement]}})
	target.requirement_matches(req, _node_with(labels))
}

_field_holds(requirement, name) if {
	[req] := target.requirements_of({"origin": "term", "path": "t", "term": {"matchFields": [requirement]}})
	target.requirement_matches(req, {"metadata": {"name": name}})
}

test_in_and_not_in if {
	in_ssd := {"key": "disktype", "operator": "In", "values": ["ssd", "nvme"]}
	_expression_holds(in_ssd, {"disktype": "nvme"})
	not _expression_holds(in_ssd, {"disktype": "hdd"})
	not _expression_holds(in_ssd, {})
	not_in := {"key": "disktype", "operator": "NotIn", "values": ["hdd"]}
	_expression_holds(not_in, {"disktype": "ssd"})
	_expression_holds(not_in, {}) # a node without the label is not in the list
	not _expression_holds(not_in, {"disktype": "hdd"})
}

test_exists_and_does_not_exist if {
	_expression_holds({"key": "gpu", "operator": "Exists"}, {"gpu": ""})
	not _expression_holds({"key": "gpu", "operator": "Exists"}, {})
	_expression_holds({"key": "gpu", "operator": "DoesNotExist"}, {"cpu": "x"})
	not _expression_holds({"key": "gpu", "operator": "DoesNotExist"}, {"gpu": "a100"})
}

test_gt_and_lt_compare_integers if {
	greater := {"key": "cores", "operator": "Gt", "values": ["8"]}
	_expression_holds(greater, {"cores": "16"})
	_expression_holds(greater, {"cores": "+09"}) # strconv.ParseInt reads a sign and leading zeros
	not _expression_holds(greater, {"cores": "8"})
	not _expression_holds(greater, {"cores": "-16"})
	not _expression_holds(greater, {}) # no label, no match
	not _expression_holds(greater, {"cores": "sixteen"})
	not _expression_holds(greater, {"cores": "16.5"})
	not _expression_holds(greater, {"cores": "99999999999999999999"}) # beyond int64
	less := {"key": "cores", "operator": "Lt", "values": ["-2"]}
	_expression_holds(less, {"cores": "-3"})
	not _expression_holds(less, {"cores": "-2"})
	not _expression_holds(less, {"cores": "x"})
}

test_match_fields_compare_the_node_name if {
	_field_holds({"key": "metadata.name", "operator": "In", "values": ["node-2"]}, "node-2")
	not _field_holds({"key": "metadata.name", "operator": "In", "values": ["node-2"]}, "node-3")
	_field_holds({"key": "metadata.name", "operator": "NotIn", "values": ["node-2"]}, "node-3")
	not _field_holds({"key": "metadata.name", "operator": "NotIn", "values": ["node-2"]}, "node-2")
}

test_gt_in_a_decision if {
	nodes := [_node("node-1", {}), _node("node-2", {"cores": "64"}), _node("node-3", {"cores": "many"}), _node("node-4", {"cores": "8"})]
	term := {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["16"]}]}
	inp := {"migration": _migration({"addedNodeSelectorTerm": term}), "vmi": _vmi, "nodes": nodes}
	_decide(inp).candidateNodes == ["node-2"]
	_explained(inp)["node-3"] == `does not match spec.addedNodeSelectorTerm.matchExpressions[0] (cores Gt ["16"])`
}

# Malformed terms ---------------------------------------------------------------------------------

_invalid_term(spec, message) if {
	d := _decide(_input(spec))
	d.candidateNodes == []
	d.targetNodeAffinity == null
	d.error.reason == "InvalidTerm"
	d.error.message == concat("", ["migration default/migration-job: ", message])
}

_expression(requirement) := {"addedNodeSelectorTerm": {"matchExpressions": [requirement]}}

_field(requirement) := {"addedNodeSelectorTerm": {"matchFields": [requirement]}}

test_unknown_operator if {
	_invalid_term(
		_expression({"key": "zone", "operator": "Near", "values": ["a"]}),
		`spec.addedNodeSelectorTerm.matchExpressions[0].operator: unknown operator "Near"`,
	)
	_invalid_term(_expression({"key": "zone"}), "spec.addedNodeSelectorTerm.matchExpressions[0].operator: unknown operator null")
}

test_invalid_term_is_reported_even_when_nodes_would_match if {
	term := {"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}, {"key": "zone", "operator": "Near"}]}
	_invalid_term(
		{"addedNodeSelectorTerm": term},
		`spec.addedNodeSelectorTerm.matchExpressions[1].operator: unknown operator "Near"`,
	)
}

test_term_must_be_an_object_or_a_list_of_one if {
	_invalid_term(
		{"addedNodeSelectorTerm": "node-2"},
		`spec.addedNodeSelectorTerm: must be a NodeSelectorTerm object (or a list of exactly one), got "node-2"`,
	)
	_invalid_term(
		{"addedNodeSelectorTerm": [_named("node-2"), _named("node-3")]},
		`spec.addedNodeSelectorTerm: must be a NodeSelectorTerm object (or a list of exactly one), got [{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-2"]}]},{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-3"]}]}]`,
	)
	_invalid_term({"addedNodeSelectorTerm": ["node-2"]}, `spec.addedNodeSelectorTerm[0]: must be a NodeSelectorTerm object, got "node-2"`)
	_invalid_term({"addedNodeSelectorTerm": {"matchExpression": []}}, `spec.addedNodeSelectorTerm: unknown field "matchExpression"`)
	_invalid_term({"addedNodeSelectorTerm": {"matchFields": {}}}, "spec.addedNodeSelectorTerm.matchFields: must be a list, got {}")
}

test_requirements_must_be_well_formed_objects if {
	_invalid_term({"addedNodeSelectorTerm": {"matchExpressions": ["zone=a"]}}, `spec.addedNodeSelectorTerm.matchExpressions[0]: must be a NodeSelectorRequirement object, got "zone=a"`)
	_invalid_term(
		_expression({"key": "zone", "operator": "In", "value": "a"}),
		concat("; ", [
			"spec.addedNodeSelectorTerm.matchExpressions[0].values: operator In needs at least one value, got 0",
			"spec.addedNodeSelectorTerm.matchExpressions[0]: unknown field \"value\"",
		]),
	)
}

test_match_fields_support_only_metadata_name_in_and_not_in if {
	_invalid_term(
		_field({"key": "metadata.uid", "operator": "In", "values": ["x"]}),
		`spec.addedNodeSelectorTerm.matchFields[0].key: matchFields supports only metadata.name, got "metadata.uid"`,
	)
	_invalid_term(
		_field({"key": "metadata.name", "operator": "Exists"}),
		`spec.addedNodeSelectorTerm.matchFields[0].operator: matchFields supports only In and NotIn, got "Exists"`,
	)
	_invalid_term(
		_field({"key": "metadata.name", "operator": "In", "values": ["node-2", "node-3"]}),
		"spec.addedNodeSelectorTerm.matchFields[0].values: operator In needs exactly one node name, got 2",
	)
}

test_operator_arity if {
	_invalid_term(_expression({"key": "zone", "operator": "NotIn", "values": []}), "spec.addedNodeSelectorTerm.matchExpressions[0].values: operator NotIn needs at least one value, got 0")
	_invalid_term(_expression({"key": "zone", "operator": "Exists", "values": ["a"]}), "spec.addedNodeSelectorTerm.matchExpressions[0].values: operator Exists needs no values, got 1")
	_invalid_term(_expression({"key": "zone", "operator": "DoesNotExist", "values": ["a", "b"]}), "spec.addedNodeSelectorTerm.matchExpressions[0].values: operator DoesNotExist needs no values, got 2")
	_invalid_term(_expression({"key": "cores", "operator": "Gt", "values": ["1", "2"]}), "spec.addedNodeSelectorTerm.matchExpressions[0].values: operator Gt needs exactly one value, got 2")
	_invalid_term(_expression({"key": "cores", "operator": "Lt"}), "spec.addedNodeSelectorTerm.matchExpressions[0].values: operator Lt needs exactly one value, got 0")
	_invalid_term(_expression({"key": "cores", "operator": "Gt", "values": ["eight"]}), `spec.addedNodeSelectorTerm.matchExpressions[0].values[0]: operator Gt needs an integer, got "eight"`)
}

test_values_must_be_strings if {
	_invalid_term(_expression({"key": "zone", "operator": "In", "values": ["a", 1]}), "spec.addedNodeSelectorTerm.matchExpressions[0].values[1]: must be a string, got 1")
	_invalid_term(_expression({"key": "zone", "operator": "In", "values": "a"}), concat("; ", [
		`spec.addedNodeSelectorTerm.matchExpressions[0].values: must be a list of strings, got "a"`,
		"spec.addedNodeSelectorTerm.matchExpressions[0].values: operator In needs at least one value, got 0",
	]))
	_invalid_term(_expression({"key": "cores", "operator": "Gt", "values": [8]}), "spec.addedNodeSelectorTerm.matchExpressions[0].values[0]: must be a string, got 8")
}

test_label_keys_must_be_qualified_names if {
	_invalid_term(_expression({"key": "disk type", "operator": "Exists"}), `spec.addedNodeSelectorTerm.matchExpressions[0].key: invalid label key "disk type"`)
	_invalid_term(_expression({"key": "Example.com/zone", "operator": "Exists"}), `spec.addedNodeSelectorTerm.matchExpressions[0].key: invalid label key "Example.com/zone"`)
	_invalid_term(_expression({"key": "a/b/c", "operator": "Exists"}), `spec.addedNodeSelectorTerm.matchExpressions[0].key: invalid label key "a/b/c"`)
	_invalid_term(_expression({"key": concat("", ["x" | some _ in numbers.range(1, 64)]), "operator": "Exists"}), sprintf("spec.addedNodeSelectorTerm.matchExpressions[0].key: invalid label key %q", [concat("", ["x" | some _ in numbers.range(1, 64)])]))
	_invalid_term(_expression({"operator": "Exists"}), "spec.addedNodeSelectorTerm.matchExpressions[0].key: invalid label key null")
	_decide(_input(_expression({"key": "topology.kubernetes.io/zone", "operator": "Exists"}))).error.reason == "NoMatchingNode"
	_decide(_input(_expression({"key": "kubevirt.io/Schedulable_1.x", "operator": "DoesNotExist"}))).candidateNodes == ["node-2", "node-3"]
}

test_added_node_selector_must_map_label_keys_to_strings if {
	_invalid_term({"addedNodeSelector": ["disktype=ssd"]}, `spec.addedNodeSelector: must be a map of label to value, got ["disktype=ssd"]`)
	_invalid_term({"addedNodeSelector": {"disk type": "ssd"}}, `spec.addedNodeSelector: invalid label key "disk type"`)
	_invalid_term({"addedNodeSelector": {"disktype": true}}, "spec.addedNodeSelector[disktype]: must be a string, got true")
}

test_annotation_must_hold_a_json_term if {
	inp := _annotated("{matchFields: node-2}")
	d := _decide(inp)
	d.error == {"reason": "InvalidTerm", "message": "migration default/migration-job: metadata.annotations[migrations.virt-rules.io/added-node-selector-term]: invalid JSON: {matchFields: node-2}"}
	_decide(_annotated(`"node-2"`)).error.message == `migration default/migration-job: metadata.annotations[migrations.virt-rules.io/added-node-selector-term]: must be a NodeSelectorTerm object (or a list of exactly one), got "node-2"`
	_decide(_annotated(7)).error.message == "migration default/migration-job: metadata.annotations[migrations.virt-rules.io/added-node-selector-term]: must be a string, got 7"
	_decide(_annotated(`{"matchFields": [{"key": "metadata.name", "operator": "In"}]}`)).error.message == "migration default/migration-job: metadata.annotations[migrations.virt-rules.io/added-node-selector-term].matchFields[0].values: operator In needs exactly one node name, got 0"
}

test_several_problems_are_all_reported_sorted if {
	spec := {
		"addedNodeSelectorTerm": {"matchExpressions": [{"key": "zone", "operator": "Near"}]},
		"addedNodeSelector": {"disktype": 1},
	}
	_decide(_input(spec)).error.message == concat("; ", [
		`migration default/migration-job: spec.addedNodeSelectorTerm.matchExpressions[0].operator: unknown operator "Near"`,
		"spec.addedNodeSelector[disktype]: must be a string, got 1",
	])
}
