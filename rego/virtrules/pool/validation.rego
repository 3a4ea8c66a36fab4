# VirtualMachinePool validation.
#
# What the CRD's schema and CEL rules refuse, for pools that reach the decision without the
# API server (manifests given to `virt-rules eval`): the plan of an invalid pool is its errors.
package virtrules.pool

_base_policies := {"Oldest", "Newest", "Random", "AscendingOrder", "DescendingOrder"}

# METADATA
# scope: document
# description: Why input.pool cannot be planned, each as a field path, a colon and a message.
errors contains "metadata.name: required" if not is_string(object.get(_pool, ["metadata", "name"], null))

errors contains msg if {
	semantics := object.get(input, "semantics", "default")
	not semantics in {"default", "kubevirt"}
	msg := sprintf("semantics: %v must be \"default\" or \"kubevirt\"", [semantics])
}

errors contains msg if {
	not _natural(object.get(_spec, "replicas", null))
	msg := sprintf("spec.replicas: %v must be an integer >= 0", [object.get(_spec, "replicas", null)])
}

errors contains "spec.template: required, a VirtualMachine template (metadata and spec)" if not is_object(_template)

errors contains "spec.template.spec: required, a VirtualMachine spec" if {
	is_object(_template)
	not is_object(object.get(_template, "spec", null))
}

errors contains msg if {
	some field in ["updateStrategy", "scaleInStrategy"]
	strategy := _spec[field]
	kinds := [kind | some kind in object.keys(_object_or_empty(strategy)); kind in _strategy_kinds]
	count(kinds) != 1
	msg := sprintf("spec.%s: set exactly one of unmanaged, opportunistic, proactive", [field])
}

errors contains msg if {
	some kind in ["opportunistic", "proactive"]
	value := _spec.scaleInStrategy[kind].statePreservation
	value == "Online"
	msg := sprintf("spec.scaleInStrategy.%s.statePreservation: Online is not supported until VM memory state can be kept on a PVC; use Offline or Disabled", [kind])
}

errors contains msg if {
	some kind in ["opportunistic", "proactive"]
	value := _spec.scaleInStrategy[kind].statePreservation
	not value in {"Disabled", "Offline", "Online"}
	msg := sprintf("spec.scaleInStrategy.%s.statePreservation: %v must be Disabled or Offline", [kind, value])
}

errors contains msg if {
	some field in ["updateStrategy", "scaleInStrategy"]
	policy := _spec[field].proactive.selectionPolicy.basePolicy
	not policy in _base_policies
	msg := sprintf("spec.%s.proactive.selectionPolicy.basePolicy: %v must be one of Oldest, Newest, Random, AscendingOrder, DescendingOrder", [field, policy])
}

errors contains msg if {
	some field in ["updateStrategy", "scaleInStrategy"]
	some i, p in _spec[field].proactive.selectionPolicy.orderedPolicies
	not is_object(object.get(p, "labelSelector", null))
	msg := sprintf("spec.%s.proactive.selectionPolicy.orderedPolicies[%d].labelSelector: required, a label selector", [field, i])
}

errors contains msg if {
	value := _spec.maxUnavailable
	not _natural(value)
	not regex.match(`^(100|[1-9]?[0-9])%$`, sprintf("%v", [value]))
	msg := sprintf("spec.maxUnavailable: %v must be an integer >= 0 or a percentage such as 25%%", [value])
}

errors contains msg if {
	value := _spec.autohealing.startupFailureThreshold
	not _positive_integer(value)
	msg := sprintf("spec.autohealing.startupFailureThreshold: %v must be an integer >= 1", [value])
}

_object_or_empty(x) := x if is_object(x)

_object_or_empty(x) := {} if not is_object(x)

errors contains msg if {
	value := _spec.autohealing.minFailingToStartDuration
	not _duration(value)
	msg := sprintf("spec.autohealing.minFailingToStartDuration: %v must be a duration such as 5m", [value])
}

_duration(value) if time.parse_duration_ns(value) >= 0
