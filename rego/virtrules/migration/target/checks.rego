# Checks of the input other than the added constraint (package documentation in target.rego).
# Builtins fail quietly, so every field the decision reads is checked for its type here: with
# any problem the decision reports InvalidInput instead of judging nodes on a misread input.
package virtrules.migration.target

# METADATA
# scope: document
# description: |
#   What is wrong with the input other than the added constraint, each naming its path; with any,
#   no node is judged (the answer could look plausible and be wrong).
input_errors contains msg if {
	some ["vmi", msg] in _problems
}

input_errors contains _must_be(name, kind, _input(name)) if {
	some name, kind in {"migration": "object", "vmi": "object", "nodes": "array"}
	not _typed(_input(name), kind)
}

input_errors contains sprintf("sourcePod: must be %s, got %s", [_kinds.object, _shown(_source_pod)]) if {
	_source_pod != null
	not is_object(_source_pod)
}

input_errors contains sprintf("sourcePod.spec.nodeSelector: must be %s, got %s", [_kinds.labels, _shown(selector)]) if {
	selector := object.get(_object(_source_pod), ["spec", "nodeSelector"], null)
	selector != null
	not _typed(selector, "labels")
}

# The source pod's requests are the target's: checked whatever node the source pod names.
input_errors contains _must_be(_path(array.concat(["sourcePod"], path)), kind, value) if {
	pod := _object(_source_pod)
	some [path, kind] in _pod_request_fields(pod)
	value := object.get(pod, path, null)
	value != null
	not _typed(value, kind)
}

input_errors contains sprintf("kubevirt: must be %s, got %s", [_kinds.object, _shown(_input("kubevirt"))]) if {
	_input("kubevirt") != null
	not is_object(_input("kubevirt"))
}

input_errors contains sprintf("kubevirt.spec.configuration.developerConfiguration.nodeSelectors: must be %s, got %s", [_kinds.labels, _shown(_cluster_node_selectors)]) if {
	_cluster_node_selectors != null
	not _typed(_cluster_node_selectors, "labels")
}

input_errors contains sprintf("pods: must be %s, got %s", [_kinds.array, _shown(_input("pods"))]) if {
	_input("pods") != null
	not is_array(_input("pods"))
}

input_errors contains sprintf("nodes[%d]: must be %s, got %s", [i, _kinds.object, _shown(node)]) if {
	some i, node in _nodes
	not is_object(node)
}

input_errors contains sprintf("nodes[%d].metadata.name: must be a non-empty string, got %s", [i, _shown(name)]) if {
	some i, node in _nodes
	is_object(node)
	name := object.get(node, ["metadata", "name"], null)
	not _typed(name, "name")
}

input_errors contains sprintf("nodes: node %s is listed more than once", [name]) if {
	some name in _duplicate_names
}

input_errors contains sprintf("vmi.status.nodeName: node %s is not among the nodes: its CPU vendor and host-model CPU, which bind the target, are unknown", [_current_node]) if {
	# with no node at all there is no candidate to be wrong about ("there is no node")
	count(_nodes) > 0
	object.get(node_by_name, _current_node, null) == null
	not _current_node in _duplicate_names
}

input_errors contains sprintf("pods[%d]: must be %s, got %s", [i, _kinds.object, _shown(pod)]) if {
	some i, pod in _pods
	not is_object(pod)
}

input_errors contains _must_be(_path(array.concat(base, path)), kind, value) if {
	some [base, path, value, kind] in array.flatten([_vmi_fields, _feature_fields, _node_fields, _allocatable_fields, _pod_fields])
	value != null
	not _typed(value, kind)
}

# The message for a field (path) whose value is not of the kind the decision reads.
_must_be(path, kind, value) := sprintf("%s: must be %s, got %s", [path, _kinds[kind], _shown(value)])

# A field path such as nodes[2].status.allocatable from ["nodes", 2, "status", "allocatable"].
_path(segments) := concat("", [_segment(i, segment) | some i, segment in segments])

_segment(0, segment) := segment

_segment(i, segment) := concat("", [".", segment]) if {
	i > 0
	is_string(segment)
}

_segment(_, segment) := sprintf("[%d]", [segment]) if is_number(segment)

_kinds := {
	"object": "an object",
	"array": "a list",
	"objects": "a list of objects",
	"string": "a string",
	"name": "a non-empty string",
	"boolean": "a boolean",
	"labels": "a map of strings",
	"quantity": `a quantity such as "500m" or "1Gi"`,
}

_typed(value, "object") if is_object(value)

_typed(value, "array") if is_array(value)

_typed(value, "objects") if {
	is_array(value)
	every element in value {
		is_object(element)
	}
}

_typed(value, "string") if is_string(value)

_typed(value, "name") if {
	is_string(value)
	value != ""
}

_typed(value, "boolean") if is_boolean(value)

_typed(value, "labels") if {
	is_object(value)
	every element in value {
		is_string(element)
	}
}

_typed(value, "quantity") if is_number(exact_quantity(value, 0))

# The fields read from the input, as [base path, path, value or null, kind]; paths are built
# only for a field that is wrong. Pods' requests matter, and are checked, only on the nodes the
# fit check judges.
_vmi_fields := [[["vmi"], path, object.get(_vmi, path, null), kind] | some [path, kind] in [
	[["status", "nodeName"], "string"],
	[["spec", "nodeSelector"], "labels"],
	[["spec", "tolerations"], "objects"],
	[["spec", "affinity", "nodeAffinity"], "object"],
	[["spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"], "array"],
	[["spec", "domain", "resources", "requests"], "object"],
	[["spec", "domain", "resources", "requests", "cpu"], "quantity"],
	[["spec", "domain", "resources", "requests", "memory"], "quantity"],
	[["spec", "domain", "machine", "type"], "string"],
	[["status", "machine", "type"], "string"],
	[["spec", "domain", "cpu", "model"], "string"],
	[["spec", "architecture"], "string"],
	[["spec", "domain", "cpu", "features"], "objects"],
]]

_feature_fields := [[["vmi", "spec", "domain", "cpu", "features", i], path, object.get(feature, path, null), kind] |
	some i, feature in _array(object.get(_vmi, ["spec", "domain", "cpu", "features"], null))
	is_object(feature)
	some [path, kind] in [[["name"], "name"], [["policy"], "string"]]
]

# A feature must have a name.
input_errors contains sprintf("vmi.spec.domain.cpu.features[%d].name: must be a non-empty string, got null", [i]) if {
	some i, feature in _array(object.get(_vmi, ["spec", "domain", "cpu", "features"], null))
	is_object(feature)
	not "name" in object.keys(feature)
}

_node_fields := [[["nodes", i], path, object.get(node, path, null), kind] |
	some i, node in _nodes
	is_object(node)
	some [path, kind] in [
		[["metadata", "labels"], "labels"],
		[["spec", "unschedulable"], "boolean"],
		[["spec", "taints"], "objects"],
		[["status", "allocatable"], "object"],
	]
]

# Every allocatable amount is read: a resource the target pod requests, and pods.
_allocatable_fields := [[["nodes", i], ["status", "allocatable", resource], value, "quantity"] |
	some i, node in _nodes
	some resource, value in _object(object.get(_object(node), ["status", "allocatable"], null))
]

_pod_fields := array.concat(
	[[["pods", i], ["spec", "nodeName"], object.get(pod, ["spec", "nodeName"], null), "string"] |
		some i, pod in _pods
		_counts(pod)
	],
	[[["pods", i], path, object.get(pod, path, null), kind] |
		some i, pod in _pods
		_counts(pod)
		object.get(pod, ["spec", "nodeName"], null) in _fit_nodes
		some [path, kind] in _pod_request_fields(pod)
	],
)

# The fields pod_request reads, as [path, kind].
_pod_request_fields(pod) := array.flatten([
	[
		[["spec", "containers"], "objects"],
		[["spec", "initContainers"], "objects"],
		[["spec", "overhead"], "object"],
		[["spec", "resources", "requests"], "object"],
	],
	[[array.concat(base, [resource]), "quantity"] |
		some base in [["spec", "overhead"], ["spec", "resources", "requests"]]
		some resource in _resources
	],
	[[array.concat(["spec", field, j], path), kind] |
		some field in ["containers", "initContainers"]
		some j, _ in _array(object.get(pod, ["spec", field], null))
		some [path, kind] in _container_request_fields(field)
	],
])

_request_fields := array.concat(
	[[["resources", "requests"], "object"]],
	[[["resources", "requests", resource], "quantity"] | some resource in _resources],
)

_container_request_fields("containers") := _request_fields

_container_request_fields("initContainers") := array.concat(_request_fields, [[["restartPolicy"], "string"]])
