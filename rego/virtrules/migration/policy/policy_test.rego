package virtrules.migration.policy_test

import data.virtrules.migration.policy

# Helpers ---------------------------------------------------------------------------------------
#
# Every decision and explanation below is evaluated three ways and must come out the same: with
# input.policies, with input.index as Rego computes it, and with input.index after a JSON round
# trip (how the engine hands it back: sets become arrays).

_decide(doc, precedence) := decision if {
	decision := policy.decision with input as doc
		with policy.settings.precedence as precedence
	decision == policy.decision with input as _indexed(doc, precedence)
		with policy.settings.precedence as precedence
	decision == policy.decision with input as _indexed_json(doc, precedence)
		with policy.settings.precedence as precedence
}

_explain(doc, precedence) := explanation if {
	explanation := policy.explanation with input as doc
		with policy.settings.precedence as precedence
	explanation == policy.explanation with input as _indexed(doc, precedence)
		with policy.settings.precedence as precedence
	explanation == policy.explanation with input as _indexed_json(doc, precedence)
		with policy.settings.precedence as precedence
}

_index_of(policies) := index if {
	index := policy.index with input as {"policies": policies}
}

# The index of a whole input document: it reads the policies and the KubeVirt CR, and its
# precedence tuples follow the bundle's precedence setting.
_doc_index(doc, precedence) := index if {
	index := policy.index with input as object.filter(doc, {"policies", "kubevirt"})
		with policy.settings.precedence as precedence
}

_indexed(doc, precedence) := object.union(object.remove(doc, {"policies"}), {"index": _doc_index(doc, precedence)})

_indexed_json(doc, precedence) := object.union(
	object.remove(doc, {"policies"}),
	{"index": json.unmarshal(json.marshal(_doc_index(doc, precedence)))},
)

_order(explanation) := [candidate.policy | some candidate in explanation.candidates]

_reason(explanation, name) := [candidate.reason | some candidate in explanation.candidates; candidate.policy == name][0]

_candidate(explanation, name) := [candidate | some candidate in explanation.candidates; candidate.policy == name][0]

# A policy doc the design's shape: {matchLabels: {...}} for both selectors.
_policy(name, vmi_labels, namespace_labels) := {
	"metadata": {"name": name},
	"spec": {"selectors": {
		"virtualMachineInstanceSelector": {"matchLabels": vmi_labels},
		"namespaceSelector": {"matchLabels": namespace_labels},
	}},
}

# A policy doc KubeVirt's shape: plain maps of label key to value.
_plain_policy(name, vmi_labels, namespace_labels) := {
	"metadata": {"name": name},
	"spec": {"selectors": {
		"virtualMachineInstanceSelector": vmi_labels,
		"namespaceSelector": namespace_labels,
	}},
}

_with_spec(pol, fields) := object.union(pol, {"spec": object.union(pol.spec, fields)})

_vmi(labels) := {"metadata": {"name": "vm", "namespace": "ns1", "labels": labels}}

_namespace(labels) := {"metadata": {"name": "ns1", "labels": labels}}

_input(vmi_labels, namespace_labels, policies) := {
	"vmi": _vmi(vmi_labels),
	"namespace": _namespace(namespace_labels),
	"policies": policies,
}

_defaults := policy.settings.defaults

_default_configuration := object.union(_defaults, {"allowWorkloadDisruption": false})

# Settings --------------------------------------------------------------------------------------

test_settings_errors_none_for_bundle_data if {
	count(policy.settings_errors) == 0
}

test_settings_errors_unknown_precedence if {
	policy.settings_errors == {`settings.precedence: newest is not one of {"default", "kubevirt"}`} with policy.settings.precedence as "newest"
}

test_settings_errors_missing_precedence if {
	errors := policy.settings_errors with policy.settings as {"defaults": {"allowPostCopy": false}}
	errors == {`settings.precedence: null is not one of {"default", "kubevirt"}`}
}

test_settings_errors_defaults_not_an_object if {
	errors := policy.settings_errors with policy.settings as {"precedence": "default", "defaults": "none"}
	errors == {
		"settings.defaults: must be an object of MigrationConfiguration fields",
		"settings.defaults.allowPostCopy: must be a boolean (allowWorkloadDisruption follows it)",
	}
}

test_settings_errors_defaults_without_allow_post_copy if {
	errors := policy.settings_errors with policy.settings as {"precedence": "default", "defaults": {"maxDowntimeMs": 300}}
	errors == {"settings.defaults.allowPostCopy: must be a boolean (allowWorkloadDisruption follows it)"}
}

test_settings_errors_settings_not_an_object if {
	errors := policy.settings_errors with policy.settings as null
	errors == {
		`settings.precedence: null is not one of {"default", "kubevirt"}`,
		"settings.defaults: must be an object of MigrationConfiguration fields",
		"settings.defaults.allowPostCopy: must be a boolean (allowWorkloadDisruption follows it)",
	}
}

test_decision_and_explanation_undefined_with_settings_errors if {
	doc := _input({}, {}, [])
	not policy.decision with input as doc with policy.settings.precedence as "newest"
	not policy.explanation with input as doc with policy.settings.precedence as "newest"
}

# Selector shapes -------------------------------------------------------------------------------

test_selector_requirements_absent_or_empty if {
	policy.selector_requirements(null) == {}
	policy.selector_requirements({}) == {}
	policy.selector_requirements({"matchLabels": {}}) == {}
}

test_selector_requirements_match_labels if {
	policy.selector_requirements({"matchLabels": {"app": "db", "tier": ""}}) == {"app": "db", "tier": ""}
}

test_selector_requirements_plain_map if {
	policy.selector_requirements({"app": "db", "tier": ""}) == {"app": "db", "tier": ""}
}

test_selector_requirements_undefined_for_malformed_selectors if {
	# Decoded so the type checker does not reject the argument before the test runs.
	not policy.selector_requirements(json.unmarshal(`"app=db"`))
	not policy.selector_requirements(json.unmarshal(`["app"]`))
	not policy.selector_requirements({"app": true})
	not policy.selector_requirements({"app": 1})
	not policy.selector_requirements({"matchLabels": null})
	not policy.selector_requirements({"matchLabels": {"app": true}})
	not policy.selector_requirements({"matchLabels": {"app": "db"}, "tier": "front"})
	not policy.selector_requirements({"matchExpressions": [{"key": "app", "operator": "Exists"}]})
	not policy.selector_requirements({"matchLabels": {"app": "db"}, "matchExpressions": []})
}

test_requirements_both_shapes_normalise_alike if {
	design := policy.requirements(_policy("a", {"app": "db"}, {"team": ""}))
	plain := policy.requirements(_plain_policy("b", {"app": "db"}, {"team": ""}))
	design == {"virtualMachineInstance": {"app": "db"}, "namespace": {"team": ""}}
	plain == design
}

test_requirements_absent_selectors_are_empty if {
	policy.requirements({"metadata": {"name": "a"}}) == {"virtualMachineInstance": {}, "namespace": {}}
	policy.requirements({"metadata": {"name": "a"}, "spec": {}}) == {"virtualMachineInstance": {}, "namespace": {}}
	policy.requirements({"metadata": {"name": "a"}, "spec": {"selectors": {"namespaceSelector": null}}}) == {
		"virtualMachineInstance": {},
		"namespace": {},
	}
}

test_requirements_leave_out_a_malformed_scope if {
	pol := _plain_policy("a", {"app": true}, {"team": "x"})
	policy.requirements(pol) == {"namespace": {"team": "x"}}
}

# Index -----------------------------------------------------------------------------------------

test_index_entry if {
	pol := _with_spec(_policy("db", {"app": "db", "tier": ""}, {"team": "x"}), {
		"allowPostCopy": true,
		"bandwidthPerMigration": null,
		"disableTLS": true,
		"completionTimeoutPerGiB": 20,
	})

	# The rank below is the default order's; the test holds whatever the bundle's data says.
	idx := _index_of([pol]) with policy.settings.precedence as "default"
	entry := idx.policies.db
	object.remove(entry, ["configuration"]) == {
		"name": "db",
		"hasSelectors": true,
		"requirements": {"virtualMachineInstance": {"app": "db", "tier": ""}, "namespace": {"team": "x"}},
		"size": 3,
		"vmiSize": 2,
		"sortedKeys": ["app", "team", "tier"],
		"rank": [-3, ["app", "team", "tier"], -2, "db"],
	}

	# The policy's configuration is precomputed: its policy fields over the defaults; fields a
	# policy may not set (disableTLS) and null fields are ignored.
	entry.configuration.allowPostCopy == true
	entry.configuration.allowWorkloadDisruption == true
	entry.configuration.completionTimeoutPerGiB == 20
	entry.configuration.disableTLS == false
	entry.configuration.bandwidthPerMigration == "0Mi"
}

test_index_order if {
	idx := _index_of([
		_policy("vmi-key", {"tier": "", "zone": "a"}, {}),
		_policy("namespace-only", {}, {"team": "x", "priority": "high"}),
		_policy("any-tier", {"tier": ""}, {}),
		_policy("zone-b", {"tier": "db", "zone": "b"}, {"team": "x"}),
		_plain_policy("everything", {}, {}),
		{"metadata": {"name": "no-spec"}},
	]) with policy.settings.precedence as "default"

	# Ids are positions in the default precedence order.
	idx.order == {
		"0": "zone-b",
		"1": "namespace-only",
		"2": "vmi-key",
		"3": "any-tier",
		"4": "everything",
		"5": "no-spec",
	}
	idx.malformed == {}
}

# Ids are zero-padded to the width of the largest, so that they sort as positions do.
test_index_ids_sort_as_positions if {
	idx := _index_of([_policy(sprintf("p%02d", [i]), {"n": format_int(i, 10)}, {}) | some i in numbers.range(0, 10)])
	count(idx.order) == 11
	idx.order["00"] == "p00"
	idx.order["10"] == "p10"
}

test_index_malformed_policies if {
	idx := _index_of([
		_policy("good", {"app": "db"}, {}),
		_plain_policy("unquoted", {"gpu": true}, {}),
		_plain_policy("string-selector", "app=db", {}),
		{"metadata": {"name": "expressions"}, "spec": {"selectors": {"virtualMachineInstanceSelector": {
			"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}],
		}}}},
		{"metadata": {"name": 7}, "spec": {}},
		{"metadata": {"name": "null-match-labels"}, "spec": {"selectors": {"namespaceSelector": {"matchLabels": null}}}},
		{"metadata": {"name": "mixed"}, "spec": {"selectors": {"namespaceSelector": {"matchLabels": {"a": "b"}, "c": "d"}}}},
		{"metadata": {}, "spec": {}},
	])
	msg := "spec.selectors: each selector must be a map of label key to string value or {matchLabels: {...}}"
	idx.malformed == {
		"unquoted": msg,
		"string-selector": msg,
		"expressions": msg,
		"null-match-labels": msg,
		"mixed": msg,
		7: msg,
		"": msg,
	}
	object.keys(idx.policies) == {"good"}
}

# Matching --------------------------------------------------------------------------------------

test_no_policies if {
	_decide(_input({"app": "db"}, {}, []), "default") == {
		"policy": null,
		"matchingLabels": 0,
		"configuration": _default_configuration,
	}
	_explain(_input({"app": "db"}, {}, []), "default") == {"precedence": "default", "policy": null, "candidates": []}
}

test_empty_selectors_match_every_vmi if {
	every precedence in ["default", "kubevirt"] {
		doc := {"vmi": {"metadata": {"namespace": "ns1"}}, "policies": [{"metadata": {"name": "all"}, "spec": {"selectors": {}}}]}
		decision := _decide(doc, precedence)
		decision.policy == "all"
		decision.matchingLabels == 0
		_explain(doc, precedence).candidates == [{
			"policy": "all",
			"matched": true,
			"matchingLabels": 0,
			"requiredLabels": 0,
			"reason": "selected",
		}]
	}
}

# KubeVirt never matches a policy without spec.selectors (absent or null), in either order.
test_no_selectors_match_no_vmi if {
	every precedence in ["default", "kubevirt"] {
		every pol in [
			{"metadata": {"name": "none"}},
			{"metadata": {"name": "none"}, "spec": {}},
			{"metadata": {"name": "none"}, "spec": {"selectors": null, "allowPostCopy": true}},
		] {
			doc := _input({"app": "db"}, {"team": "x"}, [pol])
			_decide(doc, precedence) == {"policy": null, "matchingLabels": 0, "configuration": _default_configuration}
			_explain(doc, precedence).candidates == [{
				"policy": "none",
				"matched": false,
				"matchingLabels": 0,
				"requiredLabels": 0,
				"reason": "no spec.selectors: a policy without selectors matches no VMI (selectors: {} matches every VMI)",
			}]
		}
	}
}

test_no_selectors_lose_to_any_matching_policy if {
	doc := _input({"app": "db"}, {}, [{"metadata": {"name": "a-none"}, "spec": {"allowAutoConverge": true}}, _plain_policy("b-all", {}, {})])
	_decide(doc, "kubevirt").policy == "b-all"
	_order(_explain(doc, "kubevirt")) == ["b-all", "a-none"]
	names := policy.matching["0"] with input as _indexed(doc, "kubevirt")
		with policy.settings.precedence as "kubevirt"
	names == {"b-all"}
}

test_empty_selectors_in_both_shapes_match if {
	_decide(_input({}, {}, [_policy("design", {}, {})]), "default").policy == "design"
	_decide(_input({}, {}, [_plain_policy("plain", {}, {})]), "default").policy == "plain"
	pol := {"metadata": {"name": "nulls"}, "spec": {"selectors": {
		"virtualMachineInstanceSelector": null,
		"namespaceSelector": null,
	}}}
	_decide(_input({}, {}, [pol]), "default").policy == "nulls"
}

test_match_labels_shape_matches if {
	doc := _input({"app": "db", "os": "fedora"}, {"team": "x"}, [_policy("db", {"app": "db"}, {"team": "x"})])
	_decide(doc, "default").policy == "db"
	_decide(doc, "default").matchingLabels == 2
}

test_plain_map_shape_matches if {
	doc := _input({"app": "db", "os": "fedora"}, {"team": "x"}, [_plain_policy("db", {"app": "db"}, {"team": "x"})])
	_decide(doc, "default").policy == "db"
	_decide(doc, "default").matchingLabels == 2
}

test_value_mismatch_does_not_match if {
	doc := _input({"app": "web"}, {}, [_policy("db", {"app": "db"}, {})])
	_decide(doc, "default").policy == null
	_explain(doc, "default").candidates == [{
		"policy": "db",
		"matched": false,
		"matchingLabels": 0,
		"requiredLabels": 1,
		"reason": "VMI label app=db required, VMI has app=web",
	}]
}

test_missing_label_does_not_match if {
	doc := _input({}, {}, [_policy("db", {"app": "db"}, {})])
	_decide(doc, "default").policy == null
	_reason(_explain(doc, "default"), "db") == "VMI label app=db required, VMI has none"
}

test_key_only_requirement_matches_any_value if {
	pols := [_policy("tiered", {"tier": ""}, {"team": ""})]
	_decide(_input({"tier": "front"}, {"team": "x"}, pols), "default") == {
		"policy": "tiered",
		"matchingLabels": 2,
		"configuration": _default_configuration,
	}
	_decide(_input({"tier": ""}, {"team": ""}, pols), "default").policy == "tiered"
	_explain(_input({"tier": "front"}, {"team": "x"}, pols), "default").candidates == [{
		"policy": "tiered",
		"matched": true,
		"matchingLabels": 2,
		"requiredLabels": 2,
		"reason": "selected",
	}]
}

# KubeVirt compares values as they are: "" requires the key with the empty value.
test_empty_value_requires_an_empty_label_in_kubevirt_order if {
	pols := [_policy("tiered", {"tier": ""}, {"team": ""})]
	_decide(_input({"tier": ""}, {"team": ""}, pols), "kubevirt") == {
		"policy": "tiered",
		"matchingLabels": 2,
		"configuration": _default_configuration,
	}
	doc := _input({"tier": "front"}, {"team": ""}, pols)
	_decide(doc, "kubevirt").policy == null
	_candidate(_explain(doc, "kubevirt"), "tiered") == {
		"policy": "tiered",
		"matched": false,
		"matchingLabels": 1,
		"requiredLabels": 2,
		"reason": `VMI label tier="" required, VMI has tier=front`,
	}
	missing := _input({"app": "db"}, {"team": ""}, pols)
	_decide(missing, "kubevirt").policy == null
	_reason(_explain(missing, "kubevirt"), "tiered") == `VMI label tier="" required, VMI has none`
	policy.matching == {} with input as _indexed(doc, "kubevirt")
		with policy.settings.precedence as "kubevirt"
}

# KubeVirt's matchPolicy reads neither selector of a VMI without labels (absent, null or {}):
# every policy with spec.selectors matches it with 0 labels, and the first name wins. The
# default precedence reads the selectors.
test_unlabelled_vmi_in_kubevirt_order_matches_every_policy_with_selectors if {
	pols := [
		_plain_policy("c-namespace", {}, {"team": "x"}),
		_plain_policy("b-gpu", {"gpu": "nvidia"}, {}),
		{"metadata": {"name": "a-none"}, "spec": {"allowPostCopy": true}},
		_with_spec(_plain_policy("d-all", {}, {}), {"allowPostCopy": true}),
	]
	every vmi in [
		{"metadata": {"name": "vm", "namespace": "ns1"}},
		{"metadata": {"name": "vm", "namespace": "ns1", "labels": null}},
		_vmi({}),
	] {
		doc := {"vmi": vmi, "namespace": _namespace({"team": "y"}), "policies": pols}
		_decide(doc, "kubevirt") == {"policy": "b-gpu", "matchingLabels": 0, "configuration": _default_configuration}
		_explain(doc, "kubevirt") == {"precedence": "kubevirt", "policy": "b-gpu", "candidates": [
			{"policy": "b-gpu", "matched": true, "matchingLabels": 0, "requiredLabels": 1, "reason": "selected"},
			{
				"policy": "c-namespace", "matched": true, "matchingLabels": 0, "requiredLabels": 1,
				"reason": "lost to b-gpu: the VMI has no labels, so KubeVirt reads no selector and every policy with selectors ties; its name sorts first",
			},
			{
				"policy": "d-all", "matched": true, "matchingLabels": 0, "requiredLabels": 0,
				"reason": "lost to b-gpu: the VMI has no labels, so KubeVirt reads no selector and every policy with selectors ties; its name sorts first",
			},
			{
				"policy": "a-none", "matched": false, "matchingLabels": 0, "requiredLabels": 0,
				"reason": "no spec.selectors: a policy without selectors matches no VMI (selectors: {} matches every VMI)",
			},
		]}

		# Design 000 reads the selectors: only d-all's empty ones are met.
		_decide(doc, "default").policy == "d-all"
	}

	# One label and KubeVirt reads both selectors again.
	labelled := _input({"app": "db"}, {"team": "x"}, pols)
	_decide(labelled, "kubevirt") == {"policy": "c-namespace", "matchingLabels": 1, "configuration": _default_configuration}
}

test_unlabelled_vmi_in_kubevirt_order_without_policies_with_selectors if {
	doc := _input({}, {}, [{"metadata": {"name": "a-none"}, "spec": {}}])
	_decide(doc, "kubevirt") == {"policy": null, "matchingLabels": 0, "configuration": _default_configuration}
	_explain(doc, "kubevirt").policy == null
	_doc_index(doc, "kubevirt").firstNamed == null
}

test_index_first_named if {
	idx := _index_of([
		{"metadata": {"name": "a-none"}},
		_plain_policy("c", {"x": "y"}, {}),
		_plain_policy("b", {}, {}),
		_plain_policy("a-unquoted", {"gpu": true}, {}),
	])
	idx.firstNamed == "b"
}

test_empty_label_value_shown_quoted if {
	doc := _input({"tier": ""}, {}, [_policy("db", {"tier": "db"}, {})])
	_reason(_explain(doc, "default"), "db") == `VMI label tier=db required, VMI has tier=""`
}

test_key_only_requirement_needs_the_key if {
	doc := _input({"app": "db"}, {}, [_policy("tiered", {"tier": ""}, {"team": ""})])
	_decide(doc, "default").policy == null
	_candidate(_explain(doc, "default"), "tiered") == {
		"policy": "tiered",
		"matched": false,
		"matchingLabels": 0,
		"requiredLabels": 2,
		"reason": "VMI label tier required, VMI has none; namespace label team required, namespace has none",
	}
}

test_namespace_label_mismatch if {
	doc := _input({"app": "db"}, {"team": "y"}, [_policy("db", {"app": "db"}, {"team": "x", "zone": "a"})])
	_decide(doc, "default").policy == null
	_candidate(_explain(doc, "default"), "db") == {
		"policy": "db",
		"matched": false,
		"matchingLabels": 1,
		"requiredLabels": 3,
		"reason": "namespace label team=x required, namespace has team=y; namespace label zone=a required, namespace has none",
	}
}

test_namespace_implicit_name_label if {
	pols := [_policy("ns1-only", {}, {"kubernetes.io/metadata.name": "ns1"})]
	doc := {"vmi": _vmi({}), "policies": pols}
	_decide(doc, "default").policy == "ns1-only"
	_decide(_input({}, {"team": "x"}, pols), "default").policy == "ns1-only"
	_decide(object.union(doc, {"vmi": {"metadata": {"namespace": "ns2"}}}), "default").policy == null
}

test_namespace_labels_override_the_implicit_label if {
	pols := [_policy("other", {}, {"kubernetes.io/metadata.name": "other"})]
	_decide(_input({}, {"kubernetes.io/metadata.name": "other"}, pols), "default").policy == "other"
}

test_vmi_namespace_defaults_to_default if {
	pols := [
		_policy("in-default", {}, {"kubernetes.io/metadata.name": "default"}),
		_policy("in-ns1", {}, {"kubernetes.io/metadata.name": "ns1"}),
	]
	_decide({"vmi": {"metadata": {"name": "vm"}}, "policies": pols}, "default").policy == "in-default"
	_decide({"vmi": {}, "policies": pols}, "default").policy == "in-default"
	_decide({"vmi": _vmi({}), "policies": pols}, "default").policy == "in-ns1"
}

test_unknown_namespace_has_only_its_name_label if {
	doc := {"vmi": _vmi({"app": "db"}), "policies": [_policy("prio", {"app": "db"}, {"priority": "high"})]}
	_decide(doc, "default").policy == null
	_reason(_explain(doc, "default"), "prio") == "namespace label priority=high required, namespace has none"
}

test_malformed_policies_are_ignored if {
	pols := [
		_plain_policy("unquoted", {"gpu": true}, {}),
		{"metadata": {"name": "expressions"}, "spec": {"selectors": {"virtualMachineInstanceSelector": {"matchExpressions": []}}}},
		{"spec": {}},
	]
	doc := _input({"gpu": "true"}, {}, pols)
	_decide(doc, "default").policy == null
	_explain(doc, "default").candidates == []
}

test_index_in_input_is_used_instead_of_policies if {
	doc := {
		"vmi": _vmi({"app": "db"}),
		"policies": [_policy("ignored", {"app": "db"}, {})],
		"index": _index_of([_policy("indexed", {}, {})]),
	}
	policy.decision.policy == "indexed" with input as doc
}

# The names of the policies a VMI matches: it carries every labelled value and every key they
# require.
test_matching if {
	doc := _input({"app": "x", "tier": "db", "zone": "z"}, {"team": "a"}, [
		_policy("pair", {"app": "x", "tier": "db"}, {}),
		_policy("pair-and-zone", {"app": "x", "tier": "db", "zone": "z"}, {}),
		_policy("pair-and-other-zone", {"app": "x", "tier": "db", "zone": "y"}, {}),
		_policy("pair-and-gpu", {"app": "x", "tier": "db"}, {"gpu": ""}),
		_policy("team", {}, {"team": ""}),
		_policy("everything", {}, {}),
	])
	names := policy.matching["0"] with input as _indexed(doc, "default")
		with policy.settings.precedence as "default"
	names == {"pair", "pair-and-zone", "team", "everything"}
}

_numbered_policies(n) := [_policy(sprintf("p%04d", [i]), {"n": format_int(i, 10)}, {}) | some i in numbers.range(0, n - 1)]

# The parts of the precedence order: 64 policies, each next one four times the size of the one
# before, the last taking the rest.
test_index_parts if {
	idx := _index_of(_numbered_policies(400))
	{part: count(ids) | some part, ids in idx.parts} == {"0": 64, "1": 256, "2": 80, "3": 0, "4": 0}
	idx.parts["0"][0] == "000"
	idx.parts["1"][0] == "064"
}

# The winner may be in any part; here parts of 2, 2, 4, 8 policies and the rest.
test_winner_in_any_part if {
	policies := _numbered_policies(20)
	every i in [0, 1, 2, 3, 4, 7, 8, 15, 16, 19] {
		decision := _decide(_input({"n": format_int(i, 10)}, {}, policies), "default")
			with policy._part_starts as [0, 2, 4, 8, 16]
		decision.policy == sprintf("p%04d", [i])
	}
	_decide(_input({"n": "20"}, {}, policies), "default").policy == null
}

# The decision takes the engine's partial evaluation of `matching` when there is one: here a
# stand-in that differs from `matching`, to show which one decides.
test_decision_takes_the_partially_evaluated_matching if {
	doc := _indexed(_input({"app": "x"}, {}, [_policy("a", {"app": "x"}, {}), _policy("b", {"app": "y"}, {})]), "default")
	policy.decision.policy == "a" with input as doc
	policy.decision.policy == "b" with input as doc with data.partial.virtrules.migration.policy.matching as {"0": {"b"}}
	policy.decision.policy == null with input as doc with data.partial.virtrules.migration.policy.matching as {"0": set()}
}

test_matches if {
	idx := _index_of([_policy("db", {"app": "db", "tier": ""}, {"team": "x"})])
	policy.matches(idx.policies.db) with input as _input({"app": "db", "tier": "a"}, {"team": "x"}, [])
		with policy.settings.precedence as "default"
	not policy.matches(idx.policies.db) with input as _input({"app": "db"}, {"team": "x"}, [])
		with policy.settings.precedence as "default"
	not policy.matches(idx.policies.db) with input as _input({"app": "db", "tier": "a"}, {}, [])
		with policy.settings.precedence as "default"

	# In KubeVirt's reading tier="" requires the empty value.
	policy.matches(idx.policies.db) with input as _input({"app": "db", "tier": ""}, {"team": "x"}, [])
		with policy.settings.precedence as "kubevirt"
	not policy.matches(idx.policies.db) with input as _input({"app": "db", "tier": "a"}, {"team": "x"}, [])
		with policy.settings.precedence as "kubevirt"
}

# Precedence: default ---------------------------------------------------------------------------

test_default_more_matching_labels_win if {
	doc := _input({"app": "db", "os": "fedora"}, {"team": "x"}, [
		_policy("a-one", {"app": "db"}, {}),
		_policy("b-two", {"app": "db"}, {"team": "x"}),
	])
	_decide(doc, "default").policy == "b-two"
	_decide(doc, "default").matchingLabels == 2
	explanation := _explain(doc, "default")
	_order(explanation) == ["b-two", "a-one"]
	_reason(explanation, "b-two") == "selected"
	_reason(explanation, "a-one") == "lost to b-two: 1 matching labels, fewer than its 2"
}

# Same number of labels: the sorted matching keys decide, VMI or namespace alike.
test_default_tie_on_count_smaller_keys_win if {
	doc := _input({"gpu": "nvidia", "size": "small"}, {"bandwidth": "medium"}, [
		_policy("a-vmi", {"gpu": "nvidia", "size": "small"}, {}),
		_policy("b-mixed", {"gpu": "nvidia"}, {"bandwidth": "medium"}),
	])
	_decide(doc, "default").policy == "b-mixed"
	explanation := _explain(doc, "default")
	_order(explanation) == ["b-mixed", "a-vmi"]
	_reason(explanation, "a-vmi") == `lost to b-mixed: same 2 matching labels, but keys ["gpu", "size"] sort after its ["bandwidth", "gpu"]`
}

# Same keys: the policy with more VMI labels wins.
test_default_tie_on_keys_more_vmi_labels_win if {
	doc := _input({"app": "db"}, {"app": "shared"}, [
		_policy("a-namespace", {}, {"app": "shared"}),
		_policy("b-vmi", {"app": "db"}, {}),
	])
	_decide(doc, "default").policy == "b-vmi"
	explanation := _explain(doc, "default")
	_order(explanation) == ["b-vmi", "a-namespace"]
	_reason(explanation, "a-namespace") == "lost to b-vmi: tie so far, but 0 matching VMI labels, fewer than its 1"
}

# Same selectors (possible only doc policies admitted before validation): the name decides.
test_default_tie_on_everything_name_wins if {
	doc := _input({"app": "db"}, {"team": "x"}, [
		_policy("b", {"app": "db"}, {"team": "x"}),
		_plain_policy("a", {"app": "db"}, {"team": "x"}),
	])
	_decide(doc, "default").policy == "a"
	explanation := _explain(doc, "default")
	_order(explanation) == ["a", "b"]
	_reason(explanation, "b") == "lost to a: tie on every rule, its name sorts first"
}

test_default_key_only_requirements_count_as_matching_labels if {
	doc := _input({"app": "db", "tier": "front"}, {}, [
		_policy("exact", {"app": "db"}, {}),
		_policy("keys", {"app": "", "tier": ""}, {}),
	])
	_decide(doc, "default") == {"policy": "keys", "matchingLabels": 2, "configuration": _default_configuration}
}

# Precedence: kubevirt --------------------------------------------------------------------------

test_kubevirt_more_matching_labels_win if {
	doc := _input({"app": "db"}, {"team": "x"}, [
		_policy("a-one", {"app": "db"}, {}),
		_policy("b-two", {}, {"team": "x", "kubernetes.io/metadata.name": "ns1"}),
	])
	_decide(doc, "kubevirt").policy == "b-two"
	explanation := _explain(doc, "kubevirt")
	explanation.precedence == "kubevirt"
	_order(explanation) == ["b-two", "a-one"]
	_reason(explanation, "a-one") == "lost to b-two: 1 matching labels, fewer than its 2"
}

# Same number of labels: KubeVirt ignores the keys and prefers more VMI labels.
test_kubevirt_tie_on_count_more_vmi_labels_win if {
	doc := _input({"gpu": "nvidia", "size": "small"}, {"bandwidth": "medium"}, [
		_policy("a-vmi", {"gpu": "nvidia", "size": "small"}, {}),
		_policy("b-mixed", {"gpu": "nvidia"}, {"bandwidth": "medium"}),
	])
	_decide(doc, "kubevirt").policy == "a-vmi"
	explanation := _explain(doc, "kubevirt")
	_order(explanation) == ["a-vmi", "b-mixed"]
	_reason(explanation, "b-mixed") == "lost to a-vmi: tie so far, but 1 matching VMI labels, fewer than its 2"
}

# Same number of labels and VMI labels: KubeVirt takes the first name, whatever the keys.
test_kubevirt_tie_on_vmi_labels_name_wins if {
	doc := _input({"gpu": "nvidia", "size": "small"}, {"bandwidth": "medium", "priority": "high"}, [
		_policy("z-bandwidth", {"gpu": "nvidia"}, {"bandwidth": "medium"}),
		_policy("a-priority", {"size": "small"}, {"priority": "high"}),
	])
	_decide(doc, "kubevirt").policy == "a-priority"
	_reason(_explain(doc, "kubevirt"), "z-bandwidth") == "lost to a-priority: tie on every rule, its name sorts first"

	# The default precedence compares the keys first.
	_decide(doc, "default").policy == "z-bandwidth"
	_reason(_explain(doc, "default"), "a-priority") == `lost to z-bandwidth: same 2 matching labels, but keys ["priority", "size"] sort after its ["bandwidth", "gpu"]`
}

test_kubevirt_tie_on_everything_name_wins if {
	doc := _input({"app": "db"}, {}, [_policy("b", {"app": "db"}, {}), _plain_policy("a", {"app": "db"}, {})])
	_decide(doc, "kubevirt").policy == "a"
	_reason(_explain(doc, "kubevirt"), "b") == "lost to a: tie on every rule, its name sorts first"
}

test_rank if {
	idx := _index_of([_policy("db", {"app": "db"}, {"team": "x"})])
	policy.rank(idx.policies.db) == [-2, ["app", "team"], -1, "db"] with policy.settings.precedence as "default"
	policy.rank(idx.policies.db) == [-2, -1, "db"] with policy.settings.precedence as "kubevirt"
}

# The design's example ----------------------------------------------------------------------------

_seed_in(names) := {
	"vmi": {"metadata": {"name": "vm", "namespace": "hpc", "labels": {"size": "small", "os": "fedora", "gpu": "nvidia"}}},
	"namespace": {"metadata": {"name": "hpc", "labels": {"priority": "high", "bandwidth": "medium", "hpc-workload": "true"}}},
	"policies": [_policy(names[i], vmi, namespace) | some i, [vmi, namespace] in _seed_selectors],
}

_seed_selectors := [
	[{"size": "small", "gpu": "nvidia"}, {"priority": "high", "bandwidth": "medium"}],
	[{"size": "small", "gpu": "nvidia"}, {"priority": "high", "hpc-workload": "true"}],
	[{"size": "small", "gpu": "nvidia"}, {"priority": "high"}],
	[{"size": "small"}, {"priority": "high", "hpc-workload": "true"}],
	[{"gpu": "nvidia"}, {"priority": "high"}],
	[{"gpu": "nvidia"}, {}],
	[{"gpu": "intel"}, {"priority": "high"}],
]

test_seed_example_default_precedence if {
	doc := _seed_in(["1", "2", "3", "4", "5", "6", "7"])
	_decide(doc, "default") == {"policy": "1", "matchingLabels": 4, "configuration": _default_configuration}
	explanation := _explain(doc, "default")
	explanation.policy == "1"
	_order(explanation) == ["1", "2", "3", "4", "5", "6", "7"]
	[candidate.matched | some candidate in explanation.candidates] == [true, true, true, true, true, true, false]
	[candidate.matchingLabels | some candidate in explanation.candidates] == [4, 4, 3, 3, 2, 1, 1]
	[candidate.requiredLabels | some candidate in explanation.candidates] == [4, 4, 3, 3, 2, 1, 2]
	[candidate.reason | some candidate in explanation.candidates] == [
		"selected",
		`lost to 1: same 4 matching labels, but keys ["gpu", "hpc-workload", "priority", "size"] sort after its ["bandwidth", "gpu", "priority", "size"]`,
		"lost to 1: 3 matching labels, fewer than its 4",
		"lost to 1: 3 matching labels, fewer than its 4",
		"lost to 1: 2 matching labels, fewer than its 4",
		"lost to 1: 1 matching labels, fewer than its 4",
		"VMI label gpu=intel required, VMI has gpu=nvidia",
	]
}

# With these names KubeVirt's rules give the same order: 1 and 2 tie on counts and go by name,
# 3 has more VMI labels than 4.
test_seed_example_kubevirt_precedence if {
	doc := _seed_in(["1", "2", "3", "4", "5", "6", "7"])
	_decide(doc, "kubevirt") == {"policy": "1", "matchingLabels": 4, "configuration": _default_configuration}
	explanation := _explain(doc, "kubevirt")
	_order(explanation) == ["1", "2", "3", "4", "5", "6", "7"]
	_reason(explanation, "2") == "lost to 1: tie on every rule, its name sorts first"
	_reason(explanation, "7") == "VMI label gpu=intel required, VMI has gpu=nvidia"
}

# Named doc reverse, the design still picks policy 1 by its keys; KubeVirt picks policy 2 by name.
test_seed_example_names_reversed if {
	doc := _seed_in(["p7", "p6", "p5", "p4", "p3", "p2", "p1"])
	_order(_explain(doc, "default")) == ["p7", "p6", "p5", "p4", "p3", "p2", "p1"]
	_decide(doc, "default").policy == "p7"
	_order(_explain(doc, "kubevirt")) == ["p6", "p7", "p5", "p4", "p3", "p2", "p1"]
	_decide(doc, "kubevirt").policy == "p6"
}

# Configuration ---------------------------------------------------------------------------------

_kubevirt(migrations) := {"spec": {"configuration": {"migrations": migrations}}}

_configured(cluster, spec) := _decide(
	{
		"vmi": _vmi({"app": "db"}),
		"kubevirt": _kubevirt(cluster),
		"policies": [_with_spec(_policy("db", {"app": "db"}, {}), spec)],
	},
	"default",
).configuration

test_configuration_defaults_without_kubevirt_or_policy if {
	_decide({"vmi": _vmi({})}, "default").configuration == _default_configuration
	_decide({"vmi": _vmi({}), "kubevirt": {"spec": {}}}, "default").configuration == _default_configuration
	_configured({}, {}) == _default_configuration
}

test_configuration_kubevirt_overrides_defaults if {
	configuration := _configured({"bandwidthPerMigration": "64Mi", "disableTLS": true, "progressTimeout": null}, {})
	configuration == object.union(_default_configuration, {"bandwidthPerMigration": "64Mi", "disableTLS": true})
}

test_configuration_policy_overrides_kubevirt if {
	configuration := _configured(
		{"bandwidthPerMigration": "64Mi", "completionTimeoutPerGiB": 800, "allowAutoConverge": true},
		{"bandwidthPerMigration": "217Ki", "completionTimeoutPerGiB": 23, "maxDowntimeMs": 300},
	)
	configuration.bandwidthPerMigration == "217Ki"
	configuration.completionTimeoutPerGiB == 23
	configuration.maxDowntimeMs == 300
	configuration.allowAutoConverge == true
}

test_configuration_policy_null_fields_ignored if {
	configuration := _configured({"bandwidthPerMigration": "64Mi"}, {"bandwidthPerMigration": null, "allowPostCopy": null})
	configuration.bandwidthPerMigration == "64Mi"
	configuration.allowPostCopy == false
	configuration.allowWorkloadDisruption == false
}

test_configuration_cluster_only_fields_not_taken_from_policy if {
	configuration := _configured({"parallelMigrationsPerCluster": 9}, {
		"disableTLS": true,
		"parallelMigrationsPerCluster": 1,
		"nodeDrainTaintKey": "mine",
	})
	configuration.disableTLS == false
	configuration.parallelMigrationsPerCluster == 9
	configuration.nodeDrainTaintKey == "kubevirt.io/drain"
}

test_configuration_only_the_winner_applies if {
	doc := {
		"vmi": _vmi({"app": "db", "tier": "a"}),
		"policies": [
			_with_spec(_policy("loser", {"app": "db"}, {}), {"maxDowntimeMs": 1}),
			_with_spec(_policy("winner", {"app": "db", "tier": "a"}, {}), {"allowAutoConverge": true}),
		],
	}
	_decide(doc, "default").configuration == object.union(_default_configuration, {"allowAutoConverge": true})
	policy.configuration == object.union(_default_configuration, {"allowAutoConverge": true}) with input as doc
}

test_workload_disruption_follows_default_post_copy if {
	_configured({}, {}).allowWorkloadDisruption == false
	configuration := policy.configuration with input as {"vmi": _vmi({})}
		with policy.settings.defaults.allowPostCopy as true
	configuration.allowWorkloadDisruption == true
}

test_workload_disruption_follows_kubevirt_post_copy if {
	configuration := _configured({"allowPostCopy": true}, {})
	configuration.allowPostCopy == true
	configuration.allowWorkloadDisruption == true
}

test_workload_disruption_set_by_kubevirt if {
	configuration := _configured({"allowPostCopy": true, "allowWorkloadDisruption": false}, {})
	configuration.allowPostCopy == true
	configuration.allowWorkloadDisruption == false
}

test_workload_disruption_follows_policy_post_copy_over_kubevirt if {
	configuration := _configured({"allowWorkloadDisruption": false}, {"allowPostCopy": true})
	configuration.allowPostCopy == true
	configuration.allowWorkloadDisruption == true
}

test_workload_disruption_set_by_policy if {
	configuration := _configured({}, {"allowPostCopy": true, "allowWorkloadDisruption": false})
	configuration.allowPostCopy == true
	configuration.allowWorkloadDisruption == false
}

test_workload_disruption_policy_alone if {
	configuration := _configured({"allowPostCopy": true}, {"allowWorkloadDisruption": false})
	configuration.allowPostCopy == true
	configuration.allowWorkloadDisruption == false
}

test_workload_disruption_kept_when_policy_sets_neither if {
	configuration := _configured({"allowPostCopy": false, "allowWorkloadDisruption": true}, {"maxDowntimeMs": 300})
	configuration.allowWorkloadDisruption == true
}

test_workload_disruption_null_ignored if {
	configuration := _configured({"allowPostCopy": true, "allowWorkloadDisruption": null}, {"allowWorkloadDisruption": null})
	configuration.allowWorkloadDisruption == true
}

# The KubeVirt version served -------------------------------------------------------------------

_served(version) := {"status": {"observedKubeVirtVersion": version}}

_downtime_policy := _with_spec(_plain_policy("downtime", {"size": "small"}, {}), {"maxDowntimeMs": 300})

test_configuration_has_only_the_fields_the_served_version_stores if {
	doc := object.union(_input({"size": "small"}, {}, [_downtime_policy]), {"kubevirt": _served("v1.8.0")})
	got := _decide(doc, "default")
	got.policy == "downtime"
	not "maxDowntimeMs" in object.keys(got.configuration)
	got.configuration == object.remove(_default_configuration, {"maxDowntimeMs"})

	# v1.7 has no utilityVolumesTimeout either.
	older := object.union(_input({"size": "small"}, {}, [_downtime_policy]), {"kubevirt": _served("v1.7.0")})
	_decide(older, "default").configuration == object.remove(_default_configuration, {"maxDowntimeMs", "utilityVolumesTimeout"})
}

test_configuration_has_a_field_from_the_version_that_stores_it if {
	every version in ["v1.9.0", "1.9.0", "v1.10.2", "v1.9.1+build.5"] {
		doc := object.union(_input({"size": "small"}, {}, [_downtime_policy]), {"kubevirt": _served(version)})
		_decide(doc, "default").configuration.maxDowntimeMs == 300
	}
}

test_a_pre_release_is_older_than_its_release if {
	doc := object.union(_input({"size": "small"}, {}, [_downtime_policy]), {"kubevirt": _served("v1.9.0-rc.1")})
	not "maxDowntimeMs" in object.keys(_decide(doc, "default").configuration)
}

test_unknown_version_gets_every_field if {
	every kubevirt in [{}, _served("latest"), _served(19), {"status": {"targetKubeVirtVersion": "v1.8.0"}}] {
		doc := object.union(_input({"size": "small"}, {}, [_downtime_policy]), {"kubevirt": kubevirt})
		_decide(doc, "default").configuration.maxDowntimeMs == 300
	}
	policy.kubevirt_version == "" with input as {"kubevirt": _served("latest")}
	policy.kubevirt_version == "1.8.0" with input as {"kubevirt": _served("v1.8.0")}
}

test_settings_errors_since if {
	errors := policy.settings_errors with policy.settings.since as {"maxDowntimeMs": "v1.9"}
	errors == {"settings.since.maxDowntimeMs: v1.9 is not a version such as 1.9.0"}
	policy.settings_errors == {"settings.since: must be an object of field -> version"} with policy.settings.since as ["maxDowntimeMs"]
}

# KubeVirt v1.9's experimental options (stall detector, compression) -----------------------------

_experimental := {
	"compression": "zstd",
	"stallDetector": {"stallMargin": 8, "ewmaAlpha": "0.5", "searchLocalMinima": false},
}

test_configuration_carries_the_policy_experimental_options if {
	configuration := _configured({}, {"experimental": _experimental})
	configuration.experimental == _experimental
	object.remove(configuration, {"experimental"}) == _default_configuration
}

# A null reads as unset, at any depth KubeVirt reads; an empty object stays, as KubeVirt copies it.
test_configuration_experimental_without_nulls if {
	_configured({}, {"experimental": {"compression": null, "stallDetector": {"stallMargin": null, "switchoverTimeout": 30}}}).experimental == {"stallDetector": {"switchoverTimeout": 30}}
	_configured({}, {"experimental": {}}).experimental == {}
	_configured({}, {"experimental": {"stallDetector": {}}}).experimental == {"stallDetector": {}}
	not "experimental" in object.keys(_configured({}, {"experimental": null}))
}

# The policy's options go over what lies below them field by field, as KubeVirt merges them.
test_configuration_experimental_merged_field_by_field if {
	configuration := _configured(
		{"experimental": {"compression": "none", "stallDetector": {"stallMargin": 2, "switchoverTimeout": 30}}},
		{"experimental": {"stallDetector": {"stallMargin": 8}}},
	)
	configuration.experimental == {"compression": "none", "stallDetector": {"stallMargin": 8, "switchoverTimeout": 30}}
}

test_experimental_only_for_the_version_that_stores_it if {
	pol := _with_spec(_plain_policy("exp", {"size": "small"}, {}), {"experimental": _experimental})
	old := object.union(_input({"size": "small"}, {}, [pol]), {"kubevirt": _served("v1.8.4")})
	not "experimental" in object.keys(_decide(old, "default").configuration)
	new := object.union(_input({"size": "small"}, {}, [pol]), {"kubevirt": _served("v1.9.0")})
	_decide(new, "default").configuration.experimental == _experimental
}

# Unset means the target pod gets the source's SELinux level in KubeVirt: the reported default
# is true.
test_match_selinux_level_defaults_to_true if {
	_configured({}, {}).matchSELinuxLevelOnMigration == true
	_configured({"matchSELinuxLevelOnMigration": false}, {}).matchSELinuxLevelOnMigration == false
}

# The engine indexes a changed policy alone and assembles the index of the set from the entries
# and malformed policies of the indexes of its parts: the same index as of the whole set.
test_index_from_entries_of_parts if {
	bad := {"metadata": {"name": "bad"}, "spec": {"selectors": {"namespaceSelector": {"matchExpressions": []}}}}
	policies := array.concat(_numbered_policies(70), [_plain_policy("no-labels-last", {}, {}), bad])
	whole := _index_of(policies)
	first := _index_of(array.slice(policies, 0, 30))
	rest := _index_of(array.slice(policies, 30, 72))
	entries := array.concat([entry | some entry in first.policies], [entry | some entry in rest.policies])
	malformed := object.union(first.malformed, rest.malformed)
	assembled := policy.index with input as {"entries": entries, "malformed": malformed}
	assembled == whole
	whole.malformed == {"bad": "spec.selectors: each selector must be a map of label key to string value or {matchLabels: {...}}"}
	whole.ids["no-labels-last"] == "70"
	whole.order["70"] == "no-labels-last"
}
