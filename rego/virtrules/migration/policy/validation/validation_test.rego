package virtrules.migration.policy.validation_test

# The parent package, not this one: Regal's pointless-import takes a parent for the own package.
# regal ignore:pointless-import
import data.virtrules.migration.policy
import data.virtrules.migration.policy.validation

# Helpers ---------------------------------------------------------------------------------------

# The shipped (design 000) admission, whatever the bundle's data says.
_decision(doc, others) := _decision_in(doc, others, "default")

_decision_in(doc, others, precedence) := decision if {
	decision := validation.decision with input as {"policy": doc, "policies": others}
		with policy.settings.precedence as precedence
}

_violations(doc) := _decision(doc, []).violations

_violation(field, message) := {"field": field, "message": message}

_policy(name, spec) := {"metadata": {"name": name}, "spec": spec}

_selectors(vmi, namespace) := {"selectors": {"virtualMachineInstanceSelector": vmi, "namespaceSelector": namespace}}

_named(name, vmi, namespace) := _policy(name, _selectors(vmi, namespace))

# A policy with the given configuration fields and valid selectors.
_configured(fields) := _policy("p", object.union(_selectors({"app": "db"}, {}), fields))

_repeat(text, n) := concat("", [text | some _ in numbers.range(1, n)])

_allowed := {"allowed": true, "violations": []}

_name_rule := "letters, digits, '-', '_' and '.', starting and ending with a letter or digit"

# Valid policies --------------------------------------------------------------------------------

test_valid_design_shape if {
	doc := _policy("hpc", {
		"selectors": {
			"virtualMachineInstanceSelector": {"matchLabels": {"size": "small", "kubevirt.io/gpu": ""}},
			"namespaceSelector": {"matchLabels": {"hpc-workload": "true"}},
		},
		"allowAutoConverge": true,
		"bandwidthPerMigration": "217Ki",
		"completionTimeoutPerGiB": 23,
		"allowPostCopy": false,
		"allowWorkloadDisruption": true,
		"maxDowntimeMs": 300,
	})
	_decision(doc, []) == _allowed
}

test_valid_plain_shape if {
	_decision(_named("hpc", {"size": "small"}, {"priority": "high"}), []) == _allowed
}

test_valid_without_spec_or_selectors if {
	_decision({"metadata": {"name": "all"}}, []) == _allowed
	_decision(_policy("all", {}), []) == _allowed
	_decision(_policy("all", {"selectors": {}}), []) == _allowed
	_decision(_named("all", null, {"matchLabels": {}}), []) == _allowed
}

test_null_configuration_fields_are_not_set if {
	doc := _configured({
		"allowAutoConverge": null,
		"allowPostCopy": null,
		"allowWorkloadDisruption": null,
		"bandwidthPerMigration": null,
		"completionTimeoutPerGiB": null,
		"maxDowntimeMs": null,
	})
	_decision(doc, []) == _allowed
}

# Object and name -------------------------------------------------------------------------------

test_policy_must_be_an_object if {
	validation.decision == {"allowed": false, "violations": [_violation("", "the MigrationPolicy must be an object, got null")]} with input as {}
	_violations("hpc") == [_violation("", `the MigrationPolicy must be an object, got string "hpc"`)]
}

test_name_missing if {
	_violations({"spec": {}}) == [_violation("metadata.name", "metadata.name is missing")]
	_violations({"metadata": {"name": null}}) == [_violation("metadata.name", "metadata.name is missing")]
	_violations(_policy("", {})) == [_violation("metadata.name", "metadata.name is missing")]
}

test_name_not_a_string if {
	_violations(_policy(7, {})) == [_violation("metadata.name", "metadata.name must be a string, got number 7")]
	_violations(_policy(["a"], {})) == [_violation("metadata.name", `metadata.name must be a string, got array ["a"]`)]
}

test_spec_not_an_object if {
	_violations(_policy("p", "fast")) == [_violation("spec", `spec must be an object, got string "fast"`)]
	_violations(_policy("p", ["a"])) == [_violation("spec", `spec must be an object, got array ["a"]`)]
}

# Selector shape --------------------------------------------------------------------------------

test_selectors_not_an_object if {
	_violations(_policy("p", {"selectors": ["a"]})) == [_violation(
		"spec.selectors",
		`spec.selectors must be an object with virtualMachineInstanceSelector and/or namespaceSelector, got array ["a"]`,
	)]
}

test_unknown_selector if {
	_violations(_policy("p", {"selectors": {"vmiSelector": {"app": "db"}}})) == [_violation(
		"spec.selectors.vmiSelector",
		`unknown selector "vmiSelector": the selectors are virtualMachineInstanceSelector and namespaceSelector`,
	)]
}

test_selector_not_a_map if {
	_violations(_named("p", "app=db", {})) == [_violation(
		"spec.selectors.virtualMachineInstanceSelector",
		`spec.selectors.virtualMachineInstanceSelector must be a map of label key to value or {matchLabels: {...}}, got string "app=db"`,
	)]
	_violations(_named("p", {}, ["team"])) == [_violation(
		"spec.selectors.namespaceSelector",
		`spec.selectors.namespaceSelector must be a map of label key to value or {matchLabels: {...}}, got array ["team"]`,
	)]
}

test_match_expressions_not_supported if {
	msg := "matchExpressions is not supported: select with matchLabels or a plain map of label key to value"
	expressions := [{"key": "app", "operator": "In", "values": ["db"]}]
	_violations(_named("p", {"matchExpressions": expressions}, {})) == [_violation(
		"spec.selectors.virtualMachineInstanceSelector.matchExpressions",
		msg,
	)]
	_violations(_named("p", {}, {"matchLabels": {"team": "x"}, "matchExpressions": []})) == [_violation(
		"spec.selectors.namespaceSelector.matchExpressions",
		msg,
	)]
}

test_plain_labels_beside_match_labels if {
	_violations(_named("p", {"matchLabels": {"app": "db"}, "tier": "front"}, {})) == [_violation(
		"spec.selectors.virtualMachineInstanceSelector.tier",
		`"tier" beside matchLabels: a selector is either {matchLabels: {...}} or a plain map of label key to value, not both`,
	)]
}

test_match_labels_not_a_map if {
	_violations(_named("p", {}, {"matchLabels": null})) == [_violation(
		"spec.selectors.namespaceSelector.matchLabels",
		"spec.selectors.namespaceSelector.matchLabels must be a map of label key to string value, got null",
	)]
	_violations(_named("p", {"matchLabels": ["app"]}, {})) == [_violation(
		"spec.selectors.virtualMachineInstanceSelector.matchLabels",
		`spec.selectors.virtualMachineInstanceSelector.matchLabels must be a map of label key to string value, got array ["app"]`,
	)]
}

# YAML `hpc-workload: true` without quotes arrives as a boolean.
test_label_value_not_a_string if {
	_violations(_named("p", {}, {"matchLabels": {"hpc-workload": true}})) == [_violation(
		"spec.selectors.namespaceSelector.matchLabels.hpc-workload",
		`label "hpc-workload" must have a string value, got boolean true; quote it in YAML`,
	)]
	_violations(_named("p", {"cores": 4}, {})) == [_violation(
		"spec.selectors.virtualMachineInstanceSelector.cores",
		`label "cores" must have a string value, got number 4; quote it in YAML`,
	)]
}

# Label syntax ----------------------------------------------------------------------------------

_key_violations(key) := [violation.message | some violation in _violations(_named("p", {key: "v"}, {}))]

_value_violations(value) := [violation.message | some violation in _violations(_named("p", {}, {"k": value}))]

test_valid_label_keys if {
	every key in {
		"a",
		"A_b-c.d",
		"kubevirt.io/arch",
		"example.com/Name_1",
		"a-b.c-d/e",
		_repeat("n", 63),
		sprintf("%s/%s", [_repeat("p", 253), _repeat("n", 63)]),
	} {
		_key_violations(key) == []
	}
}

test_label_key_with_two_slashes if {
	_key_violations("a/b/c") == [`label key "a/b/c" has more than one '/'`]
}

test_label_key_with_empty_prefix if {
	_key_violations("/n") == [`label key "/n" has an empty prefix before '/'`]
}

test_label_key_with_long_prefix if {
	prefix := _repeat("p", 254)
	_key_violations(concat("/", [prefix, "n"])) == [sprintf("label key %q: prefix %q is longer than 253 characters", [concat("/", [prefix, "n"]), prefix])]
}

test_label_key_with_invalid_prefix if {
	every prefix in {"-x.io", "x.io-", "Example.com", "x..io", "x_y.io", "x.io."} {
		key := concat("/", [prefix, "n"])
		_key_violations(key) == [sprintf("label key %q: prefix %q must be a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit", [key, prefix])]
	}
}

test_label_key_with_empty_name if {
	_key_violations("") == [`label key "" has an empty name`]
	_key_violations("x.io/") == [`label key "x.io/" has an empty name`]
}

test_label_key_with_long_name if {
	name := _repeat("n", 64)
	_key_violations(name) == [sprintf("label key %q: name %q is longer than 63 characters", [name, name])]
	key := concat("/", ["x.io", name])
	_key_violations(key) == [sprintf("label key %q: name %q is longer than 63 characters", [key, name])]
}

test_label_key_with_invalid_name if {
	every key in {"Bad Key", "-a", "a-", "_a", "a.", "a:b", "x.io/é"} {
		name := regex.replace(key, `^.*/`, "")
		_key_violations(key) == [sprintf("label key %q: name %q must be %s", [key, name, _name_rule])]
	}
}

test_valid_label_values if {
	every value in {"", "v", "A_b-c.d", "true", _repeat("v", 63)} {
		_value_violations(value) == []
	}
}

test_label_value_too_long if {
	value := _repeat("v", 64)
	_value_violations(value) == [sprintf("label %q: value %q... (%d characters) is longer than 63 characters", ["k", substring(value, 0, 20), count(value)])]
}

test_invalid_label_values if {
	every value in {"bad value!", "-v", "v-", ".v", "a/b", "é"} {
		_value_violations(value) == [sprintf("label %q: value %q must be empty or %s", ["k", value, _name_rule])]
	}
}

test_key_and_value_both_invalid if {
	_violations(_named("p", {}, {"matchLabels": {"a b": "c d"}})) == [
		_violation(
			"spec.selectors.namespaceSelector.matchLabels.a b",
			sprintf(`label "a b": value "c d" must be empty or %s`, [_name_rule]),
		),
		_violation(
			"spec.selectors.namespaceSelector.matchLabels.a b",
			sprintf(`label key "a b": name "a b" must be %s`, [_name_rule]),
		),
	]
}

# Configuration ---------------------------------------------------------------------------------

test_valid_bandwidths if {
	every bandwidth in {
		"217Ki", "1Gi", "100M", "1.5G", "1e3", "1E3", "2e-3", "0", "0Mi", "-0Mi", "+1Mi",
		".5Gi", "5.", "500m", "64k", "1Ti", "1Pi", "1Ei", "1T", "1P", "1E", 0, 1000, 1.5e9,
		"200000000n", "1000000u",
	} {
		_violations(_configured({"bandwidthPerMigration": bandwidth})) == []
	}
}

test_negative_bandwidth if {
	every bandwidth in {"-1Mi", "-0.5Gi", "-1e3", "-.1", "-1"} {
		_violations(_configured({"bandwidthPerMigration": bandwidth})) == [_violation(
			"spec.bandwidthPerMigration",
			sprintf("bandwidthPerMigration must not be negative, got %q", [bandwidth]),
		)]
	}
	_violations(_configured({"bandwidthPerMigration": -1})) == [_violation(
		"spec.bandwidthPerMigration",
		"bandwidthPerMigration must not be negative, got -1",
	)]
}

test_malformed_bandwidth if {
	every bandwidth in {"fast", "1 Mi", "1Mb", "1.5.3G", "Mi", "", "1Ki ", "1e", "1e1.5", "--1"} {
		_violations(_configured({"bandwidthPerMigration": bandwidth})) == [_violation(
			"spec.bandwidthPerMigration",
			sprintf("bandwidthPerMigration %q is not a quantity such as 64Mi, 1Gi, 100M or 1e9", [bandwidth]),
		)]
	}
}

test_bandwidth_of_the_wrong_type if {
	_violations(_configured({"bandwidthPerMigration": true})) == [_violation(
		"spec.bandwidthPerMigration",
		`bandwidthPerMigration must be a quantity such as "64Mi" or a number of bytes, got boolean true`,
	)]
}

test_completion_timeout if {
	_violations(_configured({"completionTimeoutPerGiB": 0})) == []
	_violations(_configured({"completionTimeoutPerGiB": 800})) == []
	_violations(_configured({"completionTimeoutPerGiB": -1})) == [_violation(
		"spec.completionTimeoutPerGiB",
		"completionTimeoutPerGiB must not be negative, got -1",
	)]
	_violations(_configured({"completionTimeoutPerGiB": 1.5})) == [_violation(
		"spec.completionTimeoutPerGiB",
		"completionTimeoutPerGiB must be an integer number of seconds, got number 1.5",
	)]
	_violations(_configured({"completionTimeoutPerGiB": "23"})) == [_violation(
		"spec.completionTimeoutPerGiB",
		`completionTimeoutPerGiB must be an integer number of seconds, got string "23"`,
	)]
}

test_max_downtime if {
	_violations(_configured({"maxDowntimeMs": 1})) == []
	_violations(_configured({"maxDowntimeMs": 2000000})) == []
	every downtime in {0, -300, 2000001} {
		_violations(_configured({"maxDowntimeMs": downtime})) == [_violation(
			"spec.maxDowntimeMs",
			sprintf("maxDowntimeMs must be between 1 and 2000000, got %v", [downtime]),
		)]
	}
	_violations(_configured({"maxDowntimeMs": 300.5})) == [_violation(
		"spec.maxDowntimeMs",
		"maxDowntimeMs must be an integer number of milliseconds, got number 300.5",
	)]
	_violations(_configured({"maxDowntimeMs": false})) == [_violation(
		"spec.maxDowntimeMs",
		"maxDowntimeMs must be an integer number of milliseconds, got boolean false",
	)]
}

test_booleans if {
	every field in {"allowAutoConverge", "allowPostCopy", "allowWorkloadDisruption"} {
		_violations(_configured({field: true})) == []
		_violations(_configured({field: false})) == []
		_violations(_configured({field: "true"})) == [_violation(
			concat(".", ["spec", field]),
			sprintf(`%s must be true or false, got string "true"`, [field]),
		)]
	}
}

# Violations come sorted by field, then message.
test_violations_sorted if {
	doc := _policy(null, object.union(_selectors({"gpu": true}, {}), {"maxDowntimeMs": 0, "allowPostCopy": 1}))
	[violation.field | some violation in _violations(doc)] == [
		"metadata.name",
		"spec.allowPostCopy",
		"spec.maxDowntimeMs",
		"spec.selectors.virtualMachineInstanceSelector.gpu",
	]
	_decision(doc, []).allowed == false
}

# Same selectors --------------------------------------------------------------------------------

_same_selectors(other) := _violation(
	"spec.selectors",
	sprintf("same selectors as MigrationPolicy %q; two policies may not have exactly the same selectors", [other]),
)

test_same_selectors_same_shape if {
	others := [_named("other", {"app": "db"}, {"team": "x"})]
	_decision(_named("new", {"app": "db"}, {"team": "x"}), others) == {
		"allowed": false,
		"violations": [_same_selectors("other")],
	}
}

test_same_selectors_across_shapes if {
	others := [_named("other", {"app": "db"}, {"team": ""})]
	doc := _named("new", {"matchLabels": {"app": "db"}}, {"matchLabels": {"team": ""}})
	_decision(doc, others).violations == [_same_selectors("other")]
}

test_same_selectors_absent_equals_empty if {
	others := [
		_policy("no-selectors", {}),
		_named("empty-maps", {}, {}),
		_named("empty-match-labels", {"matchLabels": {}}, null),
	]
	_decision(_policy("new", {"selectors": {}}), others).violations == [
		_same_selectors("empty-maps"),
		_same_selectors("empty-match-labels"),
	]
	only_namespace := _policy("other", {"selectors": {"namespaceSelector": {"team": "x"}}})
	_decision(_named("new", {}, {"matchLabels": {"team": "x"}}), [only_namespace]).violations == [_same_selectors("other")]
}

# A policy without spec.selectors matches no VMI (as in KubeVirt), so it is admitted beside any
# other, another without selectors included.
test_no_selectors_never_the_same_selectors if {
	others := [_policy("no-selectors", {}), _policy("null-selectors", {"selectors": null}), _named("empty-maps", {}, {})]
	_decision({"metadata": {"name": "new"}}, others) == _allowed
	_decision(_policy("new", {"selectors": null, "allowPostCopy": true}), others) == _allowed
	_decision(_policy("new", {"selectors": {}}), [_policy("no-selectors", {})]) == _allowed
}

# KubeVirt admits two policies with the same selectors (the name decides between them).
test_same_selectors_admitted_in_kubevirt_precedence if {
	others := [_named("other", {"app": "db"}, {"team": "x"})]
	_decision_in(_named("new", {"app": "db"}, {"team": "x"}), others, "kubevirt") == _allowed
}

test_same_selectors_ignores_the_old_version if {
	old := _named("same", {"app": "db"}, {})
	_decision(_named("same", {"matchLabels": {"app": "db"}}, {}), [old]) == _allowed
}

test_different_selectors_allowed if {
	others := [
		_named("other-value", {"app": "web"}, {}),
		_named("other-scope", {}, {"app": "db"}),
		_named("other-namespace", {"app": "db"}, {"team": "x"}),
		_named("more-labels", {"app": "db", "tier": "front"}, {}),
		_named("key-only", {"app": ""}, {}),
	]
	_decision(_named("new", {"app": "db"}, {}), others) == _allowed
}

test_same_selectors_not_compared_when_malformed if {
	others := [_named("other", {"app": "db", "gpu": true}, {})]
	doc := _named("new", {"app": "db", "gpu": false}, {})
	[violation.field | some violation in _decision(doc, others).violations] == ["spec.selectors.virtualMachineInstanceSelector.gpu"]
	_decision(_named("new", {"app": "db"}, {}), others) == _allowed
}

# Agreement with the precedence decision ---------------------------------------------------------

_malformed_for_precedence := [
	_named("string", "app=db", {}),
	_named("expressions", {"matchExpressions": []}, {}),
	_named("both", {"matchLabels": {"a": "b"}, "matchExpressions": []}, {}),
	_named("beside", {"matchLabels": {"a": "b"}, "c": "d"}, {}),
	_named("null-match-labels", {}, {"matchLabels": null}),
	_named("unquoted", {}, {"hpc": true}),
	_named("unquoted-match-labels", {"matchLabels": {"cores": 4}}, {}),
]

_malformed_in_index(doc) if {
	index := policy.index with input as {"policies": [doc]}
	index.malformed[doc.metadata.name]
}

test_policies_malformed_for_precedence_are_rejected if {
	every doc in _malformed_for_precedence {
		_malformed_in_index(doc)
		_decision(doc, []).allowed == false
	}
}

test_admitted_policies_are_well_formed_for_precedence if {
	every doc in [_named("design", {"matchLabels": {"a": "b"}}, {}), _named("plain", {"a": ""}, {"b": "c"})] {
		_decision(doc, []) == _allowed
		not _malformed_in_index(doc)
	}
}

# Experimental options (KubeVirt v1.9) -----------------------------------------------------------

_experimental(options) := _configured({"experimental": options})

_stall_detector(options) := _experimental({"stallDetector": options})

test_experimental_valid if {
	_violations(_experimental({})) == []
	_violations(_experimental({"compression": "zstd"})) == []
	_violations(_experimental({"compression": "none", "stallDetector": null})) == []
	_violations(_stall_detector({
		"stallMargin": 4, "ewmaAlpha": "0.4", "stallProgressTimeout": 40, "switchoverTimeout": 60,
		"precopyPossibleFactor": "1.5", "patienceWindowDecayFactor": "0.5", "searchLocalMinima": true,
		"completionTimeoutFactor": "2",
	})) == []

	# Bounds included, factors with no upper bound, whitespace around a factor.
	_violations(_stall_detector({
		"stallMargin": 0, "ewmaAlpha": "1", "patienceWindowDecayFactor": "0",
		"precopyPossibleFactor": "1", "completionTimeoutFactor": " 1000.125 ",
	})) == []
	_violations(_stall_detector({"stallMargin": 100, "patienceWindowDecayFactor": "1.000", "precopyPossibleFactor": "1e3"})) == []
}

test_experimental_of_the_wrong_shape if {
	_violations(_experimental("zstd")) == [_violation(
		"spec.experimental",
		`experimental must be an object with stallDetector and/or compression, got string "zstd"`,
	)]
	_violations(_stall_detector(true)) == [_violation(
		"spec.experimental.stallDetector",
		"experimental.stallDetector must be an object of stall detector options, got boolean true",
	)]
}

test_experimental_compression if {
	every compression in ["lz4", "", "ZSTD", 1] {
		_violations(_experimental({"compression": compression})) == [_violation(
			"spec.experimental.compression",
			sprintf(`experimental.compression must be "none" or "zstd", got %s`, [_shown(compression)]),
		)]
	}
}

_shown(value) := sprintf("%s %s", [type_name(value), json.marshal(value)])

test_stall_margin if {
	every margin in [-1, 101, 4.5, "4"] {
		_violations(_stall_detector({"stallMargin": margin})) == [_violation(
			"spec.experimental.stallDetector.stallMargin",
			sprintf("stallMargin must be an integer percentage from 0 to 100, got %s", [_shown(margin)]),
		)]
	}
}

test_stall_timeouts if {
	every field in ["stallProgressTimeout", "switchoverTimeout"] {
		_violations(_stall_detector({field: 0})) == []
		every timeout in [-1, 1.5, "60"] {
			_violations(_stall_detector({field: timeout})) == [_violation(
				concat(".", ["spec.experimental.stallDetector", field]),
				sprintf("%s must be a non-negative integer number of seconds, got %s", [field, _shown(timeout)]),
			)]
		}
	}
}

test_stall_search_local_minima if {
	_violations(_stall_detector({"searchLocalMinima": "yes"})) == [_violation(
		"spec.experimental.stallDetector.searchLocalMinima",
		`searchLocalMinima must be true or false, got string "yes"`,
	)]
}

_factor_violation(field, message) := [_violation(concat(".", ["spec.experimental.stallDetector", field]), message)]

test_stall_factors_out_of_range if {
	# ewmaAlpha is in (0, 1]: zero would never take a new sample.
	_violations(_stall_detector({"ewmaAlpha": "0"})) == _factor_violation("ewmaAlpha", `ewmaAlpha must be greater than 0, got "0"`)
	_violations(_stall_detector({"ewmaAlpha": "-0.5"})) == _factor_violation("ewmaAlpha", `ewmaAlpha must be greater than 0, got "-0.5"`)
	_violations(_stall_detector({"ewmaAlpha": "1.001"})) == _factor_violation("ewmaAlpha", `ewmaAlpha must be at most 1, got "1.001"`)
	_violations(_stall_detector({"patienceWindowDecayFactor": "1.5"})) == _factor_violation(
		"patienceWindowDecayFactor",
		`patienceWindowDecayFactor must be at most 1, got "1.5"`,
	)
	_violations(_stall_detector({"patienceWindowDecayFactor": "-0.1"})) == _factor_violation(
		"patienceWindowDecayFactor",
		`patienceWindowDecayFactor must be at least 0, got "-0.1"`,
	)
	every field in ["precopyPossibleFactor", "completionTimeoutFactor"] {
		_violations(_stall_detector({field: "0.5"})) == _factor_violation(field, sprintf(`%s must be at least 1, got "0.5"`, [field]))
	}
}

test_stall_factors_malformed if {
	every factor in ["not-a-number", "", "1.5x", "Inf", "NaN", "1,5"] {
		_violations(_stall_detector({"precopyPossibleFactor": factor})) == _factor_violation(
			"precopyPossibleFactor",
			sprintf("precopyPossibleFactor %q is not a decimal number", [factor]),
		)
	}
	_violations(_stall_detector({"ewmaAlpha": "0.4444"})) == _factor_violation("ewmaAlpha", `ewmaAlpha "0.4444" has more than 3 decimal places`)
	_violations(_stall_detector({"ewmaAlpha": 0.4})) == _factor_violation(
		"ewmaAlpha",
		`ewmaAlpha must be a decimal number in a string, such as "0.5", got number 0.4`,
	)
}

# Selector keys ---------------------------------------------------------------------------------

_keys_in(docs, precedence) := keys if {
	keys := validation.selector_keys with input as {"policies": docs}
		with policy.settings.precedence as precedence
}

_keyed := [
	_named("plain", {"app": "db"}, {"team": ""}),
	_named("match-labels", {"matchLabels": {"app": "db"}}, {"matchLabels": {"team": ""}}),
	_named("other-value", {"app": "web"}, {"team": ""}),
	_named("other-scope", {"team": ""}, {"app": "db"}),
	_policy("empty", {"selectors": {}}),
	_named("empty-maps", {}, null),
	_policy("no-selectors", {}),
	_policy("null-selectors", {"selectors": null}),
	_named("malformed", {"matchExpressions": []}, {}),
	_named("not-a-string", {"app": 1}, {}),
	"not an object",
]

# Equal keys for what the same-selectors check finds the same (both shapes, absent and empty
# selectors), different keys otherwise, null for what it never compares.
test_selector_keys if {
	keys := _keys_in(_keyed, "default")
	count(keys) == count(_keyed)
	keys[0] == keys[1]
	keys[4] == keys[5]
	count({keys[0], keys[2], keys[3], keys[4]}) == 4
	[key | some key in array.slice(keys, 0, 6); is_string(key)] == array.slice(keys, 0, 6)
	array.slice(keys, 6, count(keys)) == [null, null, null, null, null]
}

# Where the check is off every key is null: no existing policy is needed.
test_selector_keys_kubevirt_precedence_all_null if {
	_keys_in(_keyed, "kubevirt") == [null | some _ in _keyed]
}

# The promise the engine relies on: a policy is reported the same as another only when their
# keys are equal and not null, so passing `decision` only those changes nothing.
test_selector_keys_cover_every_duplicate if {
	keys := _keys_in(_keyed, "default")
	objects := [i | some i, doc in _keyed; is_object(doc)]
	count(objects) == count(_keyed) - 1
	every i in objects {
		doc := _keyed[i]
		others := [other | some j, other in _keyed; j != i]
		sharing := [other | some j, other in _keyed; j != i; keys[i] != null; keys[j] == keys[i]]
		_decision(doc, others) == _decision(doc, sharing)
	}
}

# Feature gates ---------------------------------------------------------------------------------

_kubevirt(gates, version) := {
	"apiVersion": "kubevirt.io/v1",
	"kind": "KubeVirt",
	"metadata": {"name": "kubevirt", "namespace": "kubevirt"},
	"spec": {"configuration": {"developerConfiguration": {"featureGates": gates}}},
	"status": {"observedKubeVirtVersion": version},
}

_gated_input(doc, old, kubevirt) := object.union_n([
	{"policy": doc, "policies": []},
	{key: value | some key, value in {"oldPolicy": old}; value != null},
	{key: value | some key, value in {"kubevirt": kubevirt}; value != null},
])

_gate_violations(doc, old, kubevirt) := violations if {
	violations := validation.decision.violations with input as _gated_input(doc, old, kubevirt)
}

_gate_message(name) := sprintf("setting or changing %s needs the MigrationStallDetection feature gate, which the KubeVirt CR does not enable (spec.configuration.developerConfiguration.featureGates)", [name])

_downtime(ms) := _configured({"maxDowntimeMs": ms})

_stall(fields) := _configured({"experimental": {"stallDetector": fields}})

test_gate_refuses_setting_gated_fields_without_it if {
	every kubevirt in [_kubevirt([], "v1.9.0"), _kubevirt(["LiveMigration"], ""), object.remove(_kubevirt([], "v1.9.0"), ["spec"])] {
		_gate_violations(_downtime(300), null, kubevirt) == [_violation("spec.maxDowntimeMs", _gate_message("maxDowntimeMs"))]
		_gate_violations(_stall({"stallMargin": 5}), null, kubevirt) == [_violation("spec.experimental.stallDetector", _gate_message("experimental.stallDetector"))]

		# An empty stall detector is set too; compression is not gated.
		_gate_violations(_stall({}), null, kubevirt) == [_violation("spec.experimental.stallDetector", _gate_message("experimental.stallDetector"))]
		_gate_violations(_configured({"experimental": {"compression": "zstd"}}), null, kubevirt) == []
	}
}

test_gate_enabled_admits_gated_fields if {
	kubevirt := _kubevirt(["LiveMigration", "MigrationStallDetection"], "v1.9.0")
	_gate_violations(_downtime(300), null, kubevirt) == []
	_gate_violations(_stall({"stallMargin": 5}), null, kubevirt) == []
}

test_gate_not_checked_without_the_kubevirt_cr if {
	_gate_violations(_downtime(300), null, null) == []
	_gate_violations(_stall({"stallMargin": 5}), null, null) == []
}

# KubeVirt before v1.9 stores neither field (settings.since): nothing to gate.
test_gate_not_checked_for_a_kubevirt_without_the_fields if {
	_gate_violations(_downtime(300), null, _kubevirt([], "v1.8.0")) == []
	_gate_violations(_stall({"stallMargin": 5}), null, _kubevirt([], "1.8.2")) == []
	_gate_violations(_downtime(300), null, _kubevirt([], "v1.10.0")) == [_violation("spec.maxDowntimeMs", _gate_message("maxDowntimeMs"))]
}

# An update that leaves a gated value as it was passes (nulls are unset); one that changes it,
# or sets it anew, does not.
test_gate_on_update if {
	kubevirt := _kubevirt(null, "v1.9.0")
	_gate_violations(_downtime(300), _downtime(300), kubevirt) == []
	_gate_violations(_downtime(300), _downtime(500), kubevirt) == [_violation("spec.maxDowntimeMs", _gate_message("maxDowntimeMs"))]
	_gate_violations(_downtime(300), _configured({}), kubevirt) == [_violation("spec.maxDowntimeMs", _gate_message("maxDowntimeMs"))]
	_gate_violations(_stall({"stallMargin": 5, "ewmaAlpha": null}), _stall({"stallMargin": 5}), kubevirt) == []
	_gate_violations(_stall({}), _stall({"ewmaAlpha": null}), kubevirt) == []
	_gate_violations(_stall({"stallMargin": 6}), _stall({"stallMargin": 5}), kubevirt) == [_violation("spec.experimental.stallDetector", _gate_message("experimental.stallDetector"))]

	# Unsetting is no setting.
	_gate_violations(_configured({"maxDowntimeMs": null}), _downtime(300), kubevirt) == []
	_gate_violations(_configured({}), _stall({"stallMargin": 5}), kubevirt) == []
}
