package virtrules.pool_test

import data.virtrules.pool

_errors(spec) := errors if {
	errors := pool.plan.errors with input as _input(_pool(spec), [], [])
}

test_valid_pool_has_no_errors if {
	not pool.plan.errors with input as _input(_pool({}), [], [])
}

test_exactly_one_strategy if {
	_errors({"updateStrategy": {"unmanaged": {}, "proactive": {}}}) == ["spec.updateStrategy: set exactly one of unmanaged, opportunistic, proactive"]
	_errors({"scaleInStrategy": {}}) == ["spec.scaleInStrategy: set exactly one of unmanaged, opportunistic, proactive"]
	_errors({"scaleInStrategy": "proactive"}) == ["spec.scaleInStrategy: set exactly one of unmanaged, opportunistic, proactive"]
}

test_online_state_preservation_is_refused_clearly if {
	_errors({"scaleInStrategy": {"proactive": {"statePreservation": "Online"}}}) == [
		"spec.scaleInStrategy.proactive.statePreservation: Online is not supported until VM memory state can be kept on a PVC; use Offline or Disabled",
	]
	_errors({"scaleInStrategy": {"opportunistic": {"statePreservation": "Sometimes"}}}) == [
		"spec.scaleInStrategy.opportunistic.statePreservation: Sometimes must be Disabled or Offline",
	]
}

test_field_errors if {
	_errors({"replicas": -1}) == ["spec.replicas: -1 must be an integer >= 0"]
	_errors({"maxUnavailable": "a lot"}) == ["spec.maxUnavailable: a lot must be an integer >= 0 or a percentage such as 25%"]
	_errors({"maxUnavailable": "101%"}) == ["spec.maxUnavailable: 101% must be an integer >= 0 or a percentage such as 25%"]
	_errors({"autohealing": {"startupFailureThreshold": 0}}) == ["spec.autohealing.startupFailureThreshold: 0 must be an integer >= 1"]
	_errors({"updateStrategy": {"proactive": {"selectionPolicy": {"basePolicy": "Cheapest"}}}}) == [
		"spec.updateStrategy.proactive.selectionPolicy.basePolicy: Cheapest must be one of Oldest, Newest, Random, AscendingOrder, DescendingOrder",
	]
	_errors({"scaleInStrategy": {"proactive": {"selectionPolicy": {"orderedPolicies": [{"nodeSelector": {}}]}}}}) == [
		"spec.scaleInStrategy.proactive.selectionPolicy.orderedPolicies[0].labelSelector: required, a label selector",
	]
	_errors({"template": {"spec": null}}) == ["spec.template.spec: required, a VirtualMachine spec"]
	_errors({"template": null}) == ["spec.template: required, a VirtualMachine template (metadata and spec)"]
	_errors({"template": "vm"}) == ["spec.template: required, a VirtualMachine template (metadata and spec)"]
}

test_pool_without_name if {
	doc := _input(json.patch(_pool({}), [{"op": "remove", "path": "/metadata/name"}]), [], [])
	"metadata.name: required" in pool.plan.errors with input as doc
}

test_shipped_settings_are_valid if {
	count(pool.settings_errors) == 0
}

test_settings_errors if {
	errors := pool.settings_errors with pool.settings as {
		"random": {"prefer": ["idle"]},
		"autohealing": {"initialBackoffSeconds": 0, "maxBackoffSeconds": "5m"},
		"maxUnavailableFloor": -1,
	}
	count(errors) == 4
	"settings.maxUnavailableFloor: -1 must be an integer >= 0" in errors
	"settings.autohealing.initialBackoffSeconds: 0 must be a positive integer" in errors
}

test_settings_missing_entirely if {
	errors := pool.settings_errors with pool.settings as null
	count(errors) == 4
}
