# METADATA
# title: Migration target nodes
# description: |
#   Where a VirtualMachineInstanceMigration may take its VMI once it adds a node selector term
#   (design proposal 001), the node affinity the target pod gets (the pure AND of the VMI's
#   required terms and the added term), and why no node qualifies when none does.
#
#   Input of `decision` and `explanation`, objects as the API server stores them:
#     migration: the VirtualMachineInstanceMigration (kubevirt.io/v1); the added constraint is
#                any of spec.addedNodeSelectorTerm (a NodeSelectorTerm, or a list of exactly one),
#                spec.addedNodeSelector (label: value, each an In requirement) and the annotation
#                migrations.virt-rules.io/added-node-selector-term (a term as JSON text), ANDed;
#                a term without requirements ({}) or an empty selector adds no constraint, as
#                design 001's "AddedNodeSelectorTerm is empty by default (all Nodes match)"
#     vmi:       the VirtualMachineInstance (status.nodeName, spec.nodeSelector,
#                spec.affinity.nodeAffinity, spec.tolerations, spec.domain.resources.requests,
#                spec.domain.cpu.model and .features, spec.architecture, status.machine.type,
#                spec.domain.machine.type)
#     nodes:     every Node (metadata.name/labels, spec.unschedulable/taints, status.allocatable);
#                the VMI's node must be among them (its CPU vendor and host-model labels bind
#                the target), else the input is invalid
#     pods:      optional, the Pods whose requests use the nodes' allocatable resources, each
#                counted as kube-scheduler counts it (see pod_request: containers, init
#                containers, sidecars, pod-level requests, spec.overhead)
#     sourcePod: optional, the VMI's current virt-launcher pod (spec.nodeSelector and the fields
#                pod_request reads): a host-model VMI's CPU requirements come from its CPU entries
#                when it has any (a VMI that migrated before); without it they come from the
#                node's labels, and the messages say the pod was not given. The target pod
#                virt-controller creates is rendered from the same VMI, so the source pod's
#                request (pod_request, KubeVirt's memory overhead included) is the target's;
#                without it the VMI's spec.domain.resources.requests stand in, and a NoCapacity
#                message says KubeVirt's launcher overhead is not counted
#     kubevirt:  optional, the cluster's KubeVirt CR: virt-controller puts its
#                spec.configuration.developerConfiguration.nodeSelectors on every launcher pod,
#                the target pod too, as they are when it is rendered (the VMI's nodeSelector
#                overrides them); without it none are required
#
#   Nodes are judged in this order, the first failing check being a node's reason: the added
#   term, the node the VMI runs on, the VMI's own constraints and those KubeVirt's target pod
#   adds (nodeSelector, required node affinity, NoSchedule/NoExecute taints against its
#   tolerations, the source node's CPU vendor, host-model CPU, machine type), being
#   what KubeVirt's NodeSelectorRenderer adds (kubevirt.io/schedulable=true, the architecture, a named CPU model
#   and the CPU features the VMI requires; no label of a feature it forbids, nor, host-model,
#   node-labeller.kubevirt.io/obsolete-host-model),
#   schedulable (not cordoned, not kubevirt.io/schedulable=false), room for the target pod's
#   requests (compared as the scheduler does, in integers: CPU in millicores, memory in bytes,
#   each quantity rounded up; see quantity.rego).
package virtrules.migration.target

import data.virtrules.lib.affinity

# Input ------------------------------------------------------------------------------------------

# An input field, null when absent (also when input is not an object).
_input(key) := value if {
	value := input[key]
} else := null

_migration := _object(_input("migration"))

# The VMI and its source pod are read only through their shapes (see shape), and the VMI's name.
_vmi := object.union(_vmi_shape(_object(_input("vmi"))), json.filter(_object(_input("vmi")), ["metadata/name"]))

_source_pod := _pod_shape(_input("sourcePod"))

# METADATA
# description: |
#   What the decision reads of a VMI and of its virt-launcher pod, their names aside: the
#   fields the node checks, the requests and the messages read. The rules read the VMI and
#   the source pod through it alone, so two VMIs of one shape get the same verdict on every
#   node, given the same migration constraint, nodes, pods and KubeVirt CR; each node's
#   verdict reads that node and the pods on it, and no other node but the VMI's own. The
#   drain preview decides the evacuees of one shape together by it.
shape(vmi, pod) := {"vmi": _vmi_shape(_object(vmi)), "sourcePod": _pod_shape(pod)}

_vmi_shape(vmi) := json.filter(vmi, [
	"spec/nodeSelector", "spec/tolerations", "spec/affinity/nodeAffinity",
	"spec/domain/resources/requests", "spec/domain/machine/type", "spec/domain/cpu/model",
	"spec/domain/cpu/features", "spec/architecture", "status/nodeName", "status/machine/type",
])

# Of a pod, the fields pod_request reads (each container's requests and restartPolicy, not
# its name, image or arguments) and its nodeSelector. Anything but an object stays as it is,
# for the input checks to name.
_pod_shape(pod) := object.union(
	json.filter(pod, ["spec/nodeSelector", "spec/overhead", "spec/resources/requests"]),
	{"spec": {field: _containers_shape(list) |
		some field in ["containers", "initContainers"]
		list := pod.spec[field]
	}},
) if {
	is_object(pod)
	is_object(pod.spec)
} else := json.filter(pod, ["spec"]) if is_object(pod)

else := pod

_containers_shape(list) := [_container_shape(c) | some c in list] if is_array(list)

else := list

_container_shape(c) := json.filter(c, ["resources/requests", "restartPolicy"]) if is_object(c)

else := c

_nodes := _array(_input("nodes"))

_pods := _array(_input("pods"))

_object(x) := x if is_object(x)

_object(x) := {} if not is_object(x)

_array(x) := x if is_array(x)

_array(x) := [] if not is_array(x)

_labels(obj) := labels if {
	labels := obj.metadata.labels
	is_object(labels)
} else := {}

_migration_ref := sprintf("%s/%s", [
	object.get(_migration, ["metadata", "namespace"], ""),
	object.get(_migration, ["metadata", "name"], ""),
])

_vmi_name := object.get(_vmi, ["metadata", "name"], object.get(_migration, ["spec", "vmiName"], ""))

_current_node := name if {
	name := _vmi.status.nodeName
	is_string(name)
	name != ""
}

default _current_node_text := "(none: the VMI is not running)"

_current_node_text := _current_node if _current_node

# METADATA
# description: Each well-formed node by name; a name listed twice is an input error instead.
node_by_name := {node.metadata.name: node | # regal ignore:prefer-set-or-object-rule
	# A comprehension, not an object rule: node_by_name[name] is looked up per node, and OPA
	# evaluates an object rule's body again for each key looked up (nodes x nodes).
	some node in _nodes
	is_string(node.metadata.name)
	not node.metadata.name in _duplicate_names
}

_duplicate_names contains name if {
	names := sort([node.metadata.name | some node in _nodes; is_string(node.metadata.name)])
	some i, name in names
	i > 0
	name == names[i - 1]
}

# The resources the target pod requests, each checked as kube-scheduler's fit plugin checks it:
# CPU, memory, ephemeral storage and every extended resource (KubeVirt's device plugins:
# devices.kubevirt.io/kvm, tun, vhost-net), hugepages. With the source pod given, what it
# requests anywhere (containers, init containers, pod level, overhead); else the VMI's requests.
_resources := {name |
	some list in _request_lists(_source_pod)
	some name, _ in list
} if {
	_source_pod_given
} else := {name | some name, _ in _object(object.get(_vmi, ["spec", "domain", "resources", "requests"], null))}

_request_lists(pod) := [list |
	some list in array.concat(
		[object.get(pod, ["spec", "overhead"], null), object.get(pod, ["spec", "resources", "requests"], null)],
		[_requests_of(c) | some field in ["containers", "initContainers"]; some c in _containers(pod, field)],
	)
	is_object(list)
]

# The VMI's own constraints ----------------------------------------------------------------------

_node_selector := selector if {
	selector := _vmi.spec.nodeSelector
	is_object(selector)
} else := {}

_vmi_node_affinity := object.get(_vmi, ["spec", "affinity", "nodeAffinity"], null)

_vmi_term_sources := [{"origin": "vmi", "path": path, "term": term} |
	some i, term in affinity.required_terms(_vmi_node_affinity)
	path := sprintf("vmi.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[%d]", [i])
]

_vmi_affinity_terms := [requirements_of(source) | some source in _vmi_term_sources]

_tolerations := [toleration | some toleration in _array(object.get(_vmi, ["spec", "tolerations"], null)); is_object(toleration)]

# The target pod's requests, resource: [amount as scheduler_amount counts it, text]. KubeVirt's
# virt-controller renders the target pod from the VMI as it rendered the source launcher pod
# (services renderLaunchManifest: the VMI's requests plus its memory overhead, the same
# containers, init containers and overhead), so with the source pod given its effective request
# is the target's; without it, the VMI's own requests stand in, without KubeVirt's overhead.
# A resource requested at 0 is not checked, as the scheduler's fit check skips it.
_target_requests := _launcher_requests if {
	_source_pod_given
} else := _vmi_requests

_launcher_requests[resource] := [amount, _amount(resource, amount)] if {
	some resource in _resources
	amount := pod_request(_source_pod, resource)
	amount > 0
}

_vmi_requests[resource] := [quantity, value] if {
	some resource in _resources
	value := _vmi.spec.domain.resources.requests[resource]
	quantity := scheduler_amount(resource, value)
	quantity > 0
}

_requester := "the launcher pod" if {
	_source_pod_given
} else := "the VMI"

# METADATA
# description: |
#   A pod's request of a resource as kube-scheduler counts it (k8s.io/component-helpers
#   resource.PodRequests): the larger of the sum over its containers and restartable init
#   containers (sidecars) and, for each other init container, its request plus the sidecars
#   started before it; replaced by the pod-level request (spec.resources.requests) when the pod
#   has one for the resource; plus spec.overhead. Each quantity is rounded up (scheduler_amount).
pod_request(pod, resource) := _pod_level_request(pod, resource) + _request(object.get(pod, ["spec", "overhead"], null), resource)

_pod_level_request(pod, resource) := amount if {
	amount := scheduler_amount(resource, pod.spec.resources.requests[resource])
} else := max({_containers_request(pod, resource), _init_request(pod, resource)})

_containers_request(pod, resource) := sum([amount |
	some c in array.concat(_containers(pod, "containers"), [c | some c in _containers(pod, "initContainers"); _sidecar(c)])
	amount := _request(_requests_of(c), resource)
])

# While init container i runs, the sidecars before it run too.
_init_request(pod, resource) := max(array.concat([0], [amount |
	some i, c in inits
	not _sidecar(c)
	amount := _request(_requests_of(c), resource) + _sidecars_before(inits, i, resource)
])) if {
	inits := _containers(pod, "initContainers")
}

_sidecars_before(inits, i, resource) := sum([_request(_requests_of(s), resource) |
	some j, s in inits
	j < i
	_sidecar(s)
])

_containers(pod, field) := [c | some c in _array(object.get(pod, ["spec", field], null)); is_object(c)]

_sidecar(container) if container.restartPolicy == "Always"

_requests_of(container) := object.get(container, ["resources", "requests"], null)

# A resource list's amount of resource, 0 if it has none.
_request(list, resource) := amount if {
	amount := scheduler_amount(resource, list[resource])
} else := 0

_host_model_vmi if object.get(_vmi, ["spec", "domain", "cpu", "model"], null) in {null, "", "host-model"}

_source_labels := _labels(node_by_name[_current_node])

_host_model_prefix := "host-model-cpu.node.kubevirt.io/"

_required_feature_prefix := "host-model-required-features.node.kubevirt.io/"

_cpu_model_migration_prefix := "cpu-model-migration.node.kubevirt.io/"

_cpu_feature_prefix := "cpu-feature.node.kubevirt.io/"

_source_pod_given if is_object(_source_pod)

_source_pod_selector := selector if {
	selector := _source_pod.spec.nodeSelector
	is_object(selector)
} else := {}

# A VMI that migrated before runs in a target pod, whose nodeSelector carries the CPU of the
# node it first started on: virt-controller (prepareNodeSelectorForHostCpuModel) copies those
# entries, with their values, and reads the node's labels only when there are none.
_pod_cpu_selector[key] := value if {
	some key, value in _source_pod_selector
	_cpu_selector_key(key)
}

_cpu_selector_key(key) if contains(key, _cpu_feature_prefix)

_cpu_selector_key(key) if contains(key, _cpu_model_migration_prefix)

_source_models contains trim_prefix(key, _host_model_prefix) if {
	some key, _ in _source_labels
	startswith(key, _host_model_prefix)
}

_node_cpu_selector := object.union(
	{concat("", [_cpu_model_migration_prefix, trim_prefix(key, _host_model_prefix)]): value |
		some key, value in _source_labels
		startswith(key, _host_model_prefix)
	},
	{concat("", [_cpu_feature_prefix, trim_prefix(key, _required_feature_prefix)]): value |
		some key, value in _source_labels
		startswith(key, _required_feature_prefix)
	},
)

# METADATA
# description: |
#   What a node needs (label: value) to receive the host-model CPU of the VMI: the CPU entries
#   (cpu-feature.node.kubevirt.io/, cpu-model-migration.node.kubevirt.io/) of the source
#   launcher pod's nodeSelector (input.sourcePod) if it has any, else those derived from the
#   host-model labels of the node the VMI runs on; {} when the VMI is not host-model or
#   neither source has them (see host_model_unplaceable).
cpu_selector := _pod_cpu_selector if {
	_host_model_vmi
	count(_pod_cpu_selector) > 0
} else := _node_cpu_selector if {
	_host_model_vmi
	count(_source_models) > 0
} else := {}

# METADATA
# description: The keys of cpu_selector, sorted.
cpu_labels := sort(object.keys(cpu_selector))

# Where cpu_selector came from, for the messages.
_cpu_origin := "from the source launcher pod's nodeSelector" if {
	count(_pod_cpu_selector) > 0
} else := "from its labels; the source launcher pod was not given" if {
	not _source_pod_given
} else := "from its labels, as the source launcher pod's nodeSelector has no CPU entries"

# METADATA
# description: |
#   True when virt-controller would create no target pod for the host-model VMI: neither the
#   source launcher pod's nodeSelector nor the labels of the node the VMI runs on say its CPU
#   (no host-model-cpu.node.kubevirt.io/ label). Every node then conflicts.
host_model_unplaceable if {
	_host_model_vmi
	node_by_name[_current_node]
	count(_pod_cpu_selector) == 0
	count(_source_models) == 0
}

_unplaceable_text := sprintf("KubeVirt creates no target pod for host-model VMI %s: node %s has no %s label%s", [
	_vmi_name, _current_node, _host_model_prefix, _unplaceable_pod_text,
])

_unplaceable_pod_text := " (the source launcher pod was not given; its nodeSelector may carry the CPU)" if {
	not _source_pod_given
} else := " and the source launcher pod's nodeSelector has no CPU entries"

# What KubeVirt's virt-controller adds to the target pod's nodeSelector, whatever the VMI asks
# (pkg/virt-controller/watch/migration createTargetPod, services NodeSelectorRenderer): the VMI's
# machine type (status.machine.type, else spec.domain.machine.type) and, unless the VMI's
# nodeSelector already names a CPU vendor, the CPU vendor label of the node the VMI runs on.

_vendor_prefix := "cpu-vendor.node.kubevirt.io/"

_machine_type_prefix := "machine-type.node.kubevirt.io/"

_machine_type := machine if {
	machine := object.get(_vmi, ["status", "machine", "type"], "")
	is_string(machine)
	machine != ""
} else := machine if {
	machine := object.get(_vmi, ["spec", "domain", "machine", "type"], "")
	is_string(machine)
	machine != ""
}

_machine_type_label := concat("", [_machine_type_prefix, _machine_type])

# A node carries one vendor label; of several, the first in order (virt-controller takes any one).
_vendor_label := label if {
	not _selector_names_vendor
	label := sort([key | some key, _ in _source_labels; startswith(key, _vendor_prefix)])[0]
}

_selector_names_vendor if {
	some key, _ in _node_selector
	startswith(key, _vendor_prefix)
}

# METADATA
# description: |
#   The labels (each "true") KubeVirt's target pod requires beyond the VMI's own constraints and
#   its host-model CPU: machine-type.node.kubevirt.io/<the VMI's machine type> and the source
#   node's cpu-vendor.node.kubevirt.io/<vendor>; {} for a VMI without machine type on a node
#   without vendor label.
kubevirt_selector := object.union(
	{_machine_type_label: "true" | _machine_type},
	{_vendor_label: "true" | _vendor_label},
)

# What KubeVirt's NodeSelectorRenderer (pkg/virt-controller/services) puts in every launcher
# pod's nodeSelector before the VMI's own entries, which override it: kubevirt.io/schedulable
# "true". The source launcher pod was rendered the same way, so where its nodeSelector has the
# key its value is taken; a key the VMI's nodeSelector has is checked with it.

_schedulable_label := "kubevirt.io/schedulable"

_pod_or_default(key, fallback) := value if {
	value := _source_pod_selector[key]
	is_string(value)
} else := fallback if {
	fallback != null
	not key in object.keys(_node_selector)
}

# A named CPU model (services CPUModelLabelFromCPUModel, NodeSelectorRenderer.Render): the node
# must offer it, unless it is host-model or host-passthrough. With any model set, each feature
# whose policy is require (or none) must be offered too (CPUFeatureLabelsFromCPUFeatures; force,
# optional and disable add nothing). These labels are set to "true" over the VMI's nodeSelector.
# A VMI without model is read as defaulted to host-model (see _host_model_vmi), so its required
# features are required too; upstream's renderer, given a VMI its webhook did not default,
# would add none.

_cpu_model_prefix := "cpu-model.node.kubevirt.io/"

_cpu_model := model if {
	model := _vmi.spec.domain.cpu.model
	is_string(model)
	model != ""
}

_cpu_features := [feature |
	some feature in _array(object.get(_vmi, ["spec", "domain", "cpu", "features"], null))
	is_string(feature.name)
]

_model_selector[concat("", [_cpu_model_prefix, _cpu_model])] := "true" if {
	not _cpu_model in {"host-model", "host-passthrough"}
}

_feature_selector[concat("", [_cpu_feature_prefix, feature.name])] := "true" if {
	some feature in _cpu_features
	object.get(feature, "policy", "") in {"", "require"}
}

# kubernetes.io/arch: the VMI's spec.architecture in lower case (k8s LabelArchStable), when it
# has one; the source launcher pod's value when its nodeSelector has the key.
_arch_label := "kubernetes.io/arch"

_architecture := lower(arch) if {
	arch := _vmi.spec.architecture
	is_string(arch)
	arch != ""
} else := null

_default_selector[key] := value if {
	some [key, fallback] in [[_schedulable_label, "true"], [_arch_label, _architecture]]
	value := _pod_or_default(key, fallback)
}

# METADATA
# description: |
#   The labels (label: value) KubeVirt's NodeSelectorRenderer requires of the target pod's node
#   beyond the VMI's nodeSelector: kubevirt.io/schedulable "true" and kubernetes.io/arch (the
#   VMI's spec.architecture in lower case, if any), each the source launcher pod's value when
#   its nodeSelector has the key and left to the VMI's nodeSelector when that has it; for a VMI with a CPU model other than host-model
#   and host-passthrough, cpu-model.node.kubevirt.io/<model> "true"; cpu-feature.node.kubevirt.io/
#   <feature> "true" for each CPU feature of policy require (or none), whatever the model (a VMI
#   without model is read as defaulted to host-model).
renderer_selector := object.union_n([_default_selector, _cluster_selector, _vmi_derived_selector, _model_selector, _feature_selector])

# The KubeVirt CR's cluster-wide nodeSelectors (NewNodeSelectorRenderer copies them over the
# defaults, and the VMI's own entries over them).
_cluster_node_selectors := object.get(_object(_input("kubevirt")), ["spec", "configuration", "developerConfiguration", "nodeSelectors"], null)

_cluster_selector[key] := value if {
	some key, value in _object(_cluster_node_selectors)
	is_string(value)
	not key in object.keys(_node_selector)
}

# What NodeSelectorRenderer derives from the VMI for every launcher pod: dedicated CPUs
# (kubevirt.io/cpumanager), Hyper-V features (hyperv.node.kubevirt.io/<feature>), a manual TSC
# frequency (scheduling.node.kubevirt.io/tsc-frequency-<Hz>), realtime, SEV, SEV-ES, SEV-SNP,
# IBM Secure Execution and TDX. The target pod is rendered from the same VMI, so the entries
# the source launcher pod's nodeSelector has under these keys are required; without the
# source pod they are not known. (A previous migration's addedNodeSelector, also in that
# nodeSelector, is not carried over: virt-controller takes the new migration's.)
_vmi_derived_keys := {"kubevirt.io/cpumanager", "kubevirt.io/realtime", "kubevirt.io/sev", "kubevirt.io/sev-es", "kubevirt.io/sev-snp", "kubevirt.io/s390-pv", "kubevirt.io/tdx"}

_vmi_derived_prefixes := ["hyperv.node.kubevirt.io/", "scheduling.node.kubevirt.io/tsc-frequency-"]

_vmi_derived_selector[key] := value if {
	some key, value in _source_pod_selector
	is_string(value)
	_vmi_derived_key(key)
}

_vmi_derived_key(key) if key in _vmi_derived_keys

_vmi_derived_key(key) if {
	some prefix in _vmi_derived_prefixes
	startswith(key, prefix)
}

# METADATA
# description: |
#   The labels the target pod's node must not have (KubeVirt adds a DoesNotExist requirement to
#   every required term of the launcher pod): cpu-feature.node.kubevirt.io/<feature> for each of
#   the VMI's CPU features of policy forbid, whatever its model
#   (setNodeAffinityForbiddenFeaturePolicy), and, for a host-model VMI,
#   node-labeller.kubevirt.io/obsolete-host-model (setNodeAffinityForHostModelCpuModel). Sorted.
forbidden_labels := sort(_forbidden_features | _obsolete_host_model)

_forbidden_features contains concat("", [_cpu_feature_prefix, feature.name]) if {
	some feature in _cpu_features
	object.get(feature, "policy", "") == "forbid"
}

# services setNodeAffinityForHostModelCpuModel: a host-model VMI's launcher pod avoids a node
# whose host-model CPU virt-handler's node labeller marked obsolete.
_obsolete_host_model_label := "node-labeller.kubevirt.io/obsolete-host-model"

_obsolete_host_model contains _obsolete_host_model_label if _host_model_vmi

# Node by node -----------------------------------------------------------------------------------

# [stage, reason] per node: 1 fails the added term, 2 is the VMI's node, 3 conflicts with the
# VMI's constraints, 4 is not schedulable, 5 has no room, 6 is a candidate. The fit check, which
# needs the pods' requests, runs only for the nodes that pass the others (_fit_nodes).
# A comprehension, not an object rule: _verdicts[name] is looked up per node (_explained_verdict),
# and OPA evaluates an object rule's body again for each key looked up (nodes x nodes).
_verdicts := {name: _fit_verdict(name, verdict) | some name, verdict in _verdicts_before_fit} # regal ignore:prefer-set-or-object-rule

_verdicts_before_fit[name] := _verdict_before_fit(node) if some name, node in node_by_name

_fit_nodes contains name if some name, null in _verdicts_before_fit

_verdict_before_fit(node) := [1, msg] if {
	msg := _term_mismatch(node)
} else := [2, "the VMI already runs on this node"] if {
	node.metadata.name == _current_node
} else := [3, msg] if {
	msg := _vmi_conflict(node)
} else := [4, msg] if {
	msg := _unschedulable(node)
} else := null

_fit_verdict(_, verdict) := verdict if verdict != null

_fit_verdict(name, null) := [5, msg] if {
	msg := _misfit(node_by_name[name])
} else := [6, "candidate"]

# The nodes that passed at least the checks before `stage`.
_reached(stage) := {name | some name, v in _verdicts; v[0] >= stage}

_candidates := sort(_reached(6))

_term_mismatch(node) := sprintf("does not match %s (%s)", [req.path, _requirement_text(req)]) if {
	req := [req | some req in added_requirements; not requirement_matches(req, node)][0]
}

_requirement_text(req) := sprintf("%s %s %s", [req.key, req.operator, json.marshal(req.raw.values)]) if {
	req.operator in {"In", "NotIn", "Gt", "Lt"}
} else := sprintf("%s %s", [req.key, req.operator])

_vmi_conflict(node) := sprintf("lacks label %s=%s required by the VMI's nodeSelector", [key, want]) if {
	[key, want] := [[key, want] | some key, want in _node_selector; not _labels(node)[key] == want][0]
} else := "matches none of the VMI's required node affinity terms" if {
	not _matches_vmi_affinity(node)
} else := sprintf("has taint %s, which the VMI does not tolerate", [_taint_text(taint)]) if {
	taint := [taint | some taint in _taints(node); _repels(taint)][0]
} else := sprintf("lacks label %s=true: KubeVirt migrates only between nodes of the CPU vendor of node %s", [_vendor_label, _current_node]) if {
	not _labels(node)[_vendor_label] == "true"
} else := _unplaceable_text if {
	host_model_unplaceable
} else := sprintf("lacks label %s=%s, needed for the host-model CPU of node %s (%s)", [label, value, _current_node_text, _cpu_origin]) if {
	label := [label | some label in cpu_labels; not _labels(node)[label] == cpu_selector[label]][0]
	value := cpu_selector[label]
} else := sprintf("lacks label %s=true: KubeVirt's target pod requires the VMI's machine type %s", [_machine_type_label, _machine_type]) if {
	_machine_type
	not _labels(node)[_machine_type_label] == "true"
} else := sprintf("lacks label %s=%s, which KubeVirt's launcher pod requires (%s)", [key, want, _renderer_origin(key)]) if {
	[key, want] := [[key, want] | some key, want in renderer_selector; _renderer_conflict(node, key, want)][0]
} else := _forbidden_text(label) if {
	label := [label | some label in forbidden_labels; _labels(node)[label]][0]
}

_forbidden_text(label) := sprintf("has label %s: KubeVirt's launcher pod of a host-model VMI avoids a node whose host-model CPU is obsolete", [label]) if {
	label == _obsolete_host_model_label
} else := sprintf("has label %s: the VMI forbids CPU feature %s", [label, trim_prefix(label, _cpu_feature_prefix)])

# A node labelled kubevirt.io/schedulable=false is judged unschedulable (_unschedulable), as before
# the label was required.
_renderer_conflict(node, key, want) if {
	not _labels(node)[key] == want
	not _schedulable_false(node, key)
}

_schedulable_false(node, key) if {
	key == _schedulable_label
	_labels(node)[key] == "false"
}

_renderer_origin(key) := "for the VMI's CPU model" if {
	_model_selector[key]
} else := "for a CPU feature the VMI requires" if {
	_feature_selector[key]
} else := "as the KubeVirt CR's developerConfiguration.nodeSelectors say" if {
	_cluster_selector[key] == renderer_selector[key]
} else := "for what the VMI asks of its node (dedicated CPUs, Hyper-V, TSC frequency, realtime or confidential computing), as the source launcher pod's nodeSelector says" if {
	_vmi_derived_selector[key]
} else := "as the source launcher pod's nodeSelector says" if {
	_source_pod_selector[key]
} else := "for the VMI's spec.architecture" if {
	key == _arch_label
} else := "NodeSelectorRenderer adds it to every launcher pod"

_matches_vmi_affinity(_) if count(_vmi_affinity_terms) == 0

_matches_vmi_affinity(node) if {
	some requirements in _vmi_affinity_terms
	count(requirements) > 0
	every req in requirements {
		requirement_matches(req, node)
	}
}

_taints(node) := [taint | some taint in _array(object.get(node, ["spec", "taints"], null)); is_object(taint)]

_str(obj, key) := value if {
	value := obj[key]
	is_string(value)
} else := ""

_taint_text(taint) := sprintf("%s=%s:%s", [_str(taint, "key"), _str(taint, "value"), _str(taint, "effect")]) if {
	_str(taint, "value") != ""
} else := sprintf("%s:%s", [_str(taint, "key"), _str(taint, "effect")])

# Cordoning is judged as schedulability, not as a taint the VMI fails to tolerate.
_cordon_taint := "node.kubernetes.io/unschedulable"

_repels(taint) if {
	_str(taint, "effect") in {"NoSchedule", "NoExecute"}
	_str(taint, "key") != _cordon_taint
	not _tolerated(taint)
}

_tolerated(taint) if {
	some toleration in _tolerations
	tolerates(toleration, taint)
}

# METADATA
# description: |
#   Whether a toleration tolerates a taint, as Kubernetes decides it: an empty effect covers
#   every effect, an empty key every key; Exists ignores the value, Equal (or none) compares it.
tolerates(toleration, taint) if {
	_str(toleration, "effect") in {"", _str(taint, "effect")}
	_str(toleration, "key") in {"", _str(taint, "key")}
	_value_tolerated(_str(toleration, "operator"), toleration, taint)
}

_value_tolerated("Exists", _, _)

_value_tolerated(operator, toleration, taint) if {
	operator in {"", "Equal"}
	_str(toleration, "value") == _str(taint, "value")
}

_unschedulable(node) := "cordoned (spec.unschedulable)" if {
	node.spec.unschedulable == true
} else := sprintf("cordoned (taint %s)", [_cordon_taint]) if {
	some taint in _taints(node)
	_str(taint, "key") == _cordon_taint
	_str(taint, "effect") in {"NoSchedule", "NoExecute"}
} else := "labelled kubevirt.io/schedulable=false" if {
	_labels(node)["kubevirt.io/schedulable"] == "false"
}

# As kube-scheduler's fit plugin counts: a node has none of an extended resource (a device
# plugin's, such as devices.kubevirt.io/kvm, or hugepages) it does not list as allocatable, so
# it fits no pod that requests one. What every kubelet reports (cpu, memory, ephemeral-storage,
# pods) and a node manifest written by hand may leave out is checked only when listed; a node
# without status.allocatable at all has no known capacity and is not checked.
_misfit(node) := concat("; ", problems) if {
	allocatable := node.status.allocatable
	problems := array.concat(
		[sprintf("insufficient %s: %s requests %s; %s allocatable, %v requested by pods, %v free", [
			resource, _requester, request[1], object.get(allocatable, resource, "none"), _amount(resource, used), _amount(resource, free),
		]) |
			some resource in _resources
			request := _target_requests[resource]
			amount := node_allocatable[node.metadata.name][resource]
			used := object.get(node_requests, [node.metadata.name, resource], 0)
			free := amount - used
			free < request[0]
		],
		_too_many_pods(node.metadata.name, allocatable),
	)
	count(problems) > 0
}

_kubelet_resources := {"cpu", "memory", "ephemeral-storage", "pods"}

# METADATA
# description: |
#   What each node that passes the other checks and lists status.allocatable offers of each
#   resource the target pod requests, in scheduler amounts (a resource it does not list: 0,
#   unless every kubelet reports it): the capacity check's, and the drain preview's scores.
node_allocatable[name] := {resource: _allocatable(allocatable, resource) |
	some resource in _resources
} if {
	some name in _fit_nodes
	allocatable := node_by_name[name].status.allocatable
}

_allocatable(allocatable, resource) := scheduler_amount(resource, allocatable[resource])

_allocatable(allocatable, resource) := 0 if {
	not resource in object.keys(allocatable)
	not resource in _kubelet_resources
}

# kube-scheduler's fit plugin admits a pod only while the node runs fewer pods than its
# allocatable pods.
_too_many_pods(name, allocatable) := [sprintf("too many pods: %s allocatable, %d pods on the node", [allocatable.pods, running])] if {
	running := object.get(_pod_count, name, 0)
	running + 1 > scheduler_amount("pods", allocatable.pods)
} else := []

# An amount (as scheduler_amount counts it) in the units people write: 2Gi, 512Mi, 500m, 2.
# Bytes (memory, ephemeral storage, hugepages) with the largest binary suffix that divides them;
# CPU in cores or millicores; a device count as it is.
_amount(resource, n) := sprintf("%d%s", [n / size, suffix]) if {
	_bytes(resource)
	n != 0
	[suffix, size] := [[suffix, size] | some [suffix, size] in [["Gi", 1073741824], ["Mi", 1048576], ["Ki", 1024]]; n % size == 0][0]
} else := format_int(n, 10) if {
	resource != "cpu"
}

_bytes(resource) if resource in {"memory", "ephemeral-storage"}

_bytes(resource) if startswith(resource, "hugepages-")

_amount("cpu", 0) := "0"

_amount("cpu", n) := trim_suffix(text, "000") if {
	n != 0
	text := format_int(n, 10)
	endswith(text, "000")
} else := sprintf("%sm", [format_int(n, 10)]) if n != 0

# What the pods request per node and resource, summed once for all nodes. The pods' requests
# are grouped by node with an equality OPA indexes, so the grouping is one pass, not nodes x pods.
# METADATA
# description: |
#   What the pods on each node that passes the other checks request, by node name and
#   resource, in scheduler amounts (as the capacity check counts them): the drain preview
#   scores its candidates with it.

# METADATA
# description: |
#   What the target pod requests, by resource, in scheduler amounts: the source launcher
#   pod's requests when it is given, else the VMI's spec.domain.resources.requests.
requested[resource] := request[0] if {
	some resource, request in _target_requests
}

node_requests[name] := {resource: sum([quantity | some [r, quantity] in requests; r == resource]) |
	some resource in _resources
} if {
	some name, requests in _pod_requests_by_node
}

_pod_requests_by_node[name] := requests if {
	some name in {request[0] | some request in _pod_requests}
	requests := [[resource, quantity] | [node_name, resource, quantity] := _pod_requests[_]; node_name == name] # regal ignore:prefer-some-in-iteration
}

# How many pods run on each node that passes the other checks, grouped as _pod_requests_by_node.
_pod_count[name] := count([n | n := _pod_nodes[_]; n == name]) if some name in {n | some n in _pod_nodes}

_pod_nodes := [pod.spec.nodeName |
	some pod in _pods
	_counts(pod)
	pod.spec.nodeName in _fit_nodes
]

_pod_requests := [[name, resource, quantity] |
	some pod in _pods
	_counts(pod)
	name := pod.spec.nodeName
	name in _fit_nodes
	some resource in _resources
	quantity := pod_request(pod, resource)
	quantity > 0
]

# A pod uses its node's resources unless it has terminated.
_counts(pod) if {
	is_object(pod)
	not object.get(pod, ["status", "phase"], "") in {"Succeeded", "Failed"}
}

# Decision ---------------------------------------------------------------------------------------

_invalid if count(term_errors) > 0

_invalid if count(input_errors) > 0

_target_affinity := null if {
	_invalid
} else := affinity.with_required_term(_vmi_node_affinity, added_term) if {
	_constrained
} else := _vmi_node_affinity

# METADATA
# description: |
#   The candidate target nodes (sorted names), the node affinity for the target pod (the VMI's
#   nodeAffinity with the added term ANDed into every required term, or the added term as the
#   only required term; the VMI's own nodeAffinity, null if none, when the migration adds no
#   requirement, as with an empty term; null for invalid input),
#   and, when there is no candidate, an error {reason, message}: InvalidTerm, InvalidInput,
#   NodeNotFound, AlreadyOnNode, ConflictsWithVMConstraints, NoCapacity or NoMatchingNode.
# entrypoint: true
decision := {
	"candidateNodes": _decided_candidates,
	"targetNodeAffinity": _target_affinity,
	"error": _error,
}

_decided_candidates := [] if _invalid

_decided_candidates := _candidates if not _invalid

_error := _failure("InvalidTerm", concat("; ", sort(term_errors))) if {
	count(term_errors) > 0
} else := _failure("InvalidInput", concat("; ", sort(input_errors))) if {
	count(input_errors) > 0
} else := null if {
	count(_candidates) > 0
} else := _failure("NodeNotFound", _not_found_message) if {
	count(_named_nodes) > 0
	every name in _named_nodes {
		not node_by_name[name]
	}
} else := _failure("AlreadyOnNode", sprintf("VMI %s already runs on node %s, the only node%s", [
	_vmi_name, _current_node, _matching_text,
])) if {
	_reached(2) == {_current_node}
} else := _failure("ConflictsWithVMConstraints", sprintf("every node%s conflicts with the constraints of VMI %s: %s", [
	_matching_text, _vmi_name, _node_reasons(_reached(3)),
])) if {
	count(_reached(3)) > 0
	count(_reached(4)) == 0
} else := _failure("NoCapacity", sprintf("no node has room for VMI %s: %s%s", [_vmi_name, _node_reasons(_reached(5)), _overhead_note])) if {
	count(_reached(5)) > 0
} else := _failure("NoMatchingNode", _no_match_message)

_overhead_note := "" if {
	_source_pod_given
} else := " (KubeVirt's launcher overhead is not counted: the source launcher pod was not given)"

_failure(reason, detail) := {"reason": reason, "message": sprintf("migration %s: %s", [_migration_ref, detail])}

_matching_text := " matching the added node selector term" if {
	_constrained
} else := ""

_named_nodes contains name if {
	some req in added_requirements
	req.field
	req.operator == "In"
	some name in req.values
}

_not_found_message := sprintf("node %s does not exist", [name]) if {
	[name] := sort(_named_nodes)
} else := sprintf("nodes %s do not exist", [concat(", ", sort(_named_nodes))])

_no_match_message := "no node matches the added node selector term" if {
	count(_reached(2)) == 0
	_constrained
} else := "there is no node" if {
	count(_reached(2)) == 0
} else := sprintf("every node that could take VMI %s is unschedulable: %s", [_vmi_name, _node_reasons(_reached(4))])

_shown_nodes := 5

# The first few of names with their reasons, for a message of bounded length.
_node_reasons(names) := concat("; ", array.concat(
	[sprintf("%s: %s", [name, _verdicts[name][1]]) | some name in array.slice(sort(names), 0, _shown_nodes)],
	[sprintf("and %d more", [count(names) - _shown_nodes]) | count(names) > _shown_nodes],
))

# METADATA
# description: |
#   Every node, sorted, with whether it is a candidate and the reason: the first check it
#   fails, or "candidate". With invalid input no node is evaluated; `error` is as in decision.
# entrypoint: true
explanation := {
	"nodes": [{"node": name, "candidate": verdict[0] == 6, "reason": verdict[1]} |
		some name in sort(object.keys(node_by_name))
		verdict := _explained_verdict(name)
	],
	"error": _error,
}

# METADATA
# description: |
#   The node affinity of a migration's target virt-launcher pod, for the admission webhook
#   that sees the pod KubeVirt creates. Input: migration (as stored) and nodeAffinity (the
#   pod's own, as KubeVirt copied it from the VMI; null if none). Returns it with the added
#   term ANDed into every required term (the same pure AND as decision's targetNodeAffinity,
#   with no nodes needed); null when the migration adds no requirement, so the pod is left as
#   it is; {"error": "<field>: <problem>; ..."} when the added term is invalid.
# entrypoint: true
pod_node_affinity := {"error": concat("; ", sort(term_errors))} if {
	count(term_errors) > 0
} else := affinity.with_required_term(_pod_node_affinity, added_term) if {
	_constrained
} else := null

_pod_node_affinity := input.nodeAffinity if {
	is_object(input.nodeAffinity)
} else := null

_explained_verdict(name) := [0, sprintf("not evaluated: %s", [_error.reason])] if {
	_invalid
} else := _verdicts[name]
