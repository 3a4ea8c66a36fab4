package virtrules.migration.target_test

import data.virtrules.migration.target

# Invalid input -----------------------------------------------------------------------------------

_invalid_input(inp, message) if {
	d := _decide(inp)
	d.candidateNodes == []
	d.targetNodeAffinity == null
	d.error.reason == "InvalidInput"
	contains(d.error.message, message)
}

test_missing_objects_are_invalid_input if {
	_invalid_input({"migration": _migration({}), "nodes": _nodes}, "vmi: must be an object, got null")
	_invalid_input({"migration": _migration({}), "vmi": _vmi, "nodes": {}}, "nodes: must be a list, got {}")
	_invalid_input({"vmi": _vmi, "nodes": _nodes}, "migration: must be an object, got null")
	_invalid_input(object.union(_input({}), {"pods": "none"}), `pods: must be a list, got "none"`)
	_decide("nonsense").error.reason == "InvalidInput"
}

test_malformed_nodes_are_invalid_input if {
	_invalid_input(object.union(_input({}), {"nodes": ["node-2"]}), `nodes[0]: must be an object, got "node-2"`)
	_invalid_input(object.union(_input({}), {"nodes": [{"metadata": {}}]}), "nodes[0].metadata.name: must be a non-empty string, got null")
	_invalid_input(object.union(_input({}), {"nodes": [_nodes[1], _nodes[2], _node("node-2", {})]}), "nodes: node node-2 is listed more than once")
	_invalid_input(_with_node2({"status": {"allocatable": {"cpu": "four"}}}), `nodes[1].status.allocatable.cpu: must be a quantity such as "500m" or "1Gi", got "four"`)
	_invalid_input(_with_node2({"metadata": {"labels": {"rack": 1}}}), `nodes[1].metadata.labels: must be a map of strings, got {"disktype":"ssd","kubevirt.io/schedulable":"true","rack":1}`)
	_invalid_input(_with_node2({"spec": {"taints": "none"}}), `nodes[1].spec.taints: must be a list of objects, got "none"`)
	_invalid_input(_with_node2({"spec": {"unschedulable": "yes"}}), `nodes[1].spec.unschedulable: must be a boolean, got "yes"`)
}

test_malformed_cpu_features_are_invalid_input if {
	_invalid_input(_with_vmi_spec({"domain": {"cpu": {"model": 7}}}), "vmi.spec.domain.cpu.model: must be a string, got 7")
	_invalid_input(_with_vmi_spec({"architecture": ["amd64"]}), `vmi.spec.architecture: must be a string, got ["amd64"]`)
	_invalid_input(_with_vmi_spec({"domain": {"cpu": {"features": "sse2"}}}), `vmi.spec.domain.cpu.features: must be a list of objects, got "sse2"`)
	_invalid_input(_with_vmi_spec({"domain": {"cpu": {"features": [{"policy": "require"}]}}}), "vmi.spec.domain.cpu.features[0].name: must be a non-empty string, got null")
	_invalid_input(_with_vmi_spec({"domain": {"cpu": {"features": [{"name": ""}]}}}), `vmi.spec.domain.cpu.features[0].name: must be a non-empty string, got ""`)
	_invalid_input(_with_vmi_spec({"domain": {"cpu": {"features": [{"name": "sse2", "policy": 1}]}}}), "vmi.spec.domain.cpu.features[0].policy: must be a string, got 1")
}

test_malformed_vmi_is_invalid_input if {
	_invalid_input(_with_vmi_spec({"domain": {"resources": {"requests": {"memory": "2 GB"}}}}), `vmi.spec.domain.resources.requests.memory: must be a quantity such as "500m" or "1Gi", got "2 GB"`)
	_invalid_input(_with_vmi_spec({"tolerations": [1]}), "vmi.spec.tolerations: must be a list of objects, got [1]")
	bad_term := {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}
	inp := _with_vmi_spec({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [bad_term]}}}})
	_invalid_input(inp, `vmi.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: unknown operator "Near"`)
	_invalid_input(_with_vmi_spec({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {}}}}}), "nodeSelectorTerms: must be a list, got {}")
}

test_malformed_pods_are_invalid_input if {
	_invalid_input(object.union(_input({}), {"pods": [1]}), "pods[0]: must be an object, got 1")
	_invalid_input(object.union(_input({}), {"pods": [{"spec": {"nodeName": 2}}]}), "pods[0].spec.nodeName: must be a string, got 2")
	_invalid_input(object.union(_input({}), {"pods": [_pod("node-2", "Running", [{"cpu": "lots"}])]}), `pods[0].spec.containers[0].resources.requests.cpu: must be a quantity such as "500m" or "1Gi", got "lots"`)
	_invalid_input(object.union(_input({}), {"pods": [{"spec": {"nodeName": "node-3", "containers": {}}}]}), "pods[0].spec.containers: must be a list of objects, got {}")
}

_bad_pod(spec) := object.union(_input({}), {"pods": [{"spec": object.union({"nodeName": "node-2", "containers": []}, spec)}]})

_bad_source(spec) := object.union(_input({}), {"sourcePod": {"spec": spec}})

test_malformed_pod_requests_name_the_field if {
	_invalid_input(_bad_pod({"initContainers": [{"resources": {"requests": {"memory": "much"}}}]}), `pods[0].spec.initContainers[0].resources.requests.memory: must be a quantity such as "500m" or "1Gi", got "much"`)
	_invalid_input(_bad_pod({"initContainers": [{"restartPolicy": true}]}), "pods[0].spec.initContainers[0].restartPolicy: must be a string, got true")
	_invalid_input(_bad_pod({"initContainers": {}}), "pods[0].spec.initContainers: must be a list of objects, got {}")
	_invalid_input(_bad_pod({"overhead": {"cpu": "x"}}), `pods[0].spec.overhead.cpu: must be a quantity such as "500m" or "1Gi", got "x"`)
	_invalid_input(_bad_pod({"overhead": []}), "pods[0].spec.overhead: must be an object, got []")
	_invalid_input(_bad_pod({"resources": {"requests": {"cpu": 1}}}), `pods[0].spec.resources.requests.cpu: must be a quantity such as "500m" or "1Gi", got 1`)
}

test_malformed_source_pod_requests_name_the_field if {
	_invalid_input(_bad_source({"containers": [{"resources": {"requests": {"cpu": "1 core"}}}]}), `sourcePod.spec.containers[0].resources.requests.cpu: must be a quantity such as "500m" or "1Gi", got "1 core"`)
	_invalid_input(_bad_source({"initContainers": [{"resources": {"requests": []}}]}), "sourcePod.spec.initContainers[0].resources.requests: must be an object, got []")
	_invalid_input(_bad_source({"overhead": {"memory": "lots"}}), `sourcePod.spec.overhead.memory: must be a quantity such as "500m" or "1Gi", got "lots"`)
	_invalid_input(_bad_source({"containers": "compute"}), `sourcePod.spec.containers: must be a list of objects, got "compute"`)
}

test_malformed_pods_on_nodes_not_judged_for_fit_are_not_read if {
	pods := [_pod("node-3", "Running", [{"cpu": "lots"}]), _pod("node-2", "Failed", [{"cpu": "lots"}])]
	_decide(object.union(_input(_to("node-2")), {"pods": pods})).candidateNodes == ["node-2"]
}

test_explanation_does_not_judge_invalid_input if {
	explanation := target.explanation with input as object.union(_input({"addedNodeSelectorTerm": "node-2"}), {})
	explanation.error.reason == "InvalidTerm"
	{entry.reason | some entry in explanation.nodes} == {"not evaluated: InvalidTerm"}
}
