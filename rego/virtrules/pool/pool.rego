# METADATA
# title: VirtualMachinePool plan
# description: |
#   What the pool controller does next for one VirtualMachinePool (pool.virt-rules.io/v1alpha1,
#   design 003): which VirtualMachines to create, delete (with or without their state), update,
#   restart and re-provision, and when to look again. The controller only applies the plan.
#
#   Input of `plan`:
#     pool:       the VirtualMachinePool as stored (defaults as the CRD applies them are
#                 assumed when absent, so that manifests decide like the cluster)
#     vms:        the VirtualMachines of the pool's namespace that the pool owns (controller
#                 ownerReference with the pool's UID) or whose names start with "<pool>-": the
#                 others hold names too (detached VMs), but are never adopted
#     vmis:       the VirtualMachineInstances of those VMs (same names)
#     volumes:    the DataVolumes kept by Offline state preservation in the namespace (label
#                 pool.virt-rules.io/preserved), of any pool
#     now:        the current time, RFC 3339
#     burstLimit: how many VMs one pass may create or update (the controller's flag)
#
#   Settings (bundle data, data.virtrules.pool.settings):
#     random.prefer:       which VMs the Random base policy takes first, in order: any of
#                          "stopped", "notReady", "ready"; the rest follow in pseudo-random order
#     autohealing:         initialBackoffSeconds, doubled per re-provisioning up to
#                          maxBackoffSeconds
#     maxUnavailableFloor: the least a percentage maxUnavailable resolves to, so that small
#                          pools still update
#     semantics:           "default" (design 003, the default when absent) or "kubevirt"
#                          (KubeVirt v1.9.0's pool.kubevirt.io/v1beta1 controller): VM names
#                          from 0; ordered label selectors filter the VMs scale-in and updates
#                          may take (matching the VMI template's labels) instead of ordering
#                          them; maxUnavailable 100% when unset, and at least the floor when an
#                          integer too; autohealing also re-provisions VMs failing to start
#                          (CrashLoopBackOff, ErrorUnschedulable, ErrImagePull,
#                          ImagePullBackOff, DataVolumeError, ErrorPvcNotFound) whose Ready
#                          condition has been False for autohealing.minFailingToStartDuration
#                          (default 5m)
package virtrules.pool

# Labels and annotations the pool controller writes. One name each, everywhere.
label_pool := "pool.virt-rules.io/pool"

label_preserved := "pool.virt-rules.io/preserved"

annotation_template_hash := "pool.virt-rules.io/template-hash"

annotation_preserved_pool := "pool.virt-rules.io/preserved-pool-uid"

annotation_preserved_vm := "pool.virt-rules.io/preserved-vm"

_settings := settings if {
	settings := data.virtrules.pool.settings
	is_object(settings)
} else := {}

_preference_states := {"stopped", "notReady", "ready"}

_semantics := object.get(_settings, "semantics", "default")

# KubeVirt's own pool semantics (settings.semantics: kubevirt).
_kubevirt if _semantics == "kubevirt"

# The number of the pool's first VM: the design's "<pool>-1", KubeVirt's "<pool>-0".
_first_ordinal := 0 if _kubevirt

else := 1

# METADATA
# description: Problems with the bundle's settings; the engine refuses a bundle that has any.
settings_errors contains msg if {
	prefer := object.get(_settings, ["random", "prefer"], null)
	not _list_of(prefer, _preference_states)
	msg := sprintf("settings.random.prefer: %v must be a list of %v", [prefer, _preference_states])
}

settings_errors contains msg if {
	some key in ["initialBackoffSeconds", "maxBackoffSeconds"]
	value := object.get(_settings, ["autohealing", key], null)
	not _positive_integer(value)
	msg := sprintf("settings.autohealing.%s: %v must be a positive integer", [key, value])
}

settings_errors contains msg if {
	not _semantics in {"default", "kubevirt"}
	msg := sprintf("settings.semantics: %v must be \"default\" or \"kubevirt\"", [_semantics])
}

settings_errors contains msg if {
	value := object.get(_settings, "maxUnavailableFloor", null)
	not _natural(value)
	msg := sprintf("settings.maxUnavailableFloor: %v must be an integer >= 0", [value])
}

_list_of(list, allowed) if {
	is_array(list)
	every item in list {
		item in allowed
	}
}

_positive_integer(x) if {
	_natural(x)
	x > 0
}

_natural(x) if {
	is_number(x)
	x == round(x)
	x >= 0
}

# The pool ------------------------------------------------------------------------------------

_pool := input.pool

_name := _pool.metadata.name

_namespace := object.get(_pool.metadata, "namespace", "default")

_uid := object.get(_pool.metadata, "uid", "")

_spec := object.get(_pool, "spec", {})

_replicas := _spec.replicas

_template := object.get(_spec, "template", {})

_prefix := concat("", [_name, "-"])

# METADATA
# description: The name of the pool's VM number n (from 1; from 0 with KubeVirt's semantics), the design's "<pool>-<n>".
vm_name(n) := sprintf("%s%d", [_prefix, n])

# METADATA
# description: The number n of a VM named "<pool>-<n>"; undefined for any other name.
ordinal(name) := to_number(suffix) if {
	startswith(name, _prefix)
	suffix := substring(name, count(_prefix), -1)
	regex.match(`^[1-9][0-9]*$`, suffix)
}

ordinal(name) := 0 if {
	_kubevirt
	name == vm_name(0)
}

# METADATA
# description: |
#   The hash of the pool's VM template. VMs carry the hash they were made from, so a VM
#   whose hash differs is outdated; VMIs carry it too, so a VMI started from an older
#   template needs a restart.
template_hash := substring(crypto.sha256(json.marshal(_template)), 0, 16)

# The hash the VMs' VMI templates carry, which tells whether a VMI runs the template: with the
# design's semantics template_hash, so that any change of the template restarts VMIs; with
# KubeVirt's, that of the VMI template alone, so that a change of the VM's own metadata or
# fields only updates the VM (KubeVirt patches the VMI's revision label, restarts nothing).
_vmi_template_hash := substring(crypto.sha256(json.marshal(object.get(_template, ["spec", "template"], {}))), 0, 16) if {
	_kubevirt
} else := template_hash

# The VMs -------------------------------------------------------------------------------------

_vms := object.get(input, "vms", [])

_vmis := {vmi.metadata.name: vmi | some vmi in object.get(input, "vmis", [])}

_owned_by_pool(vm) if {
	some ref in object.get(vm.metadata, "ownerReferences", [])
	ref.controller == true
	ref.kind == "VirtualMachinePool"
	ref.uid == _uid
}

# The pool's VMs that count: owned, not being deleted. A detached VM (its ownerReference
# removed) is never counted again, whatever its labels.
_alive := {vm.metadata.name: vm |
	some vm in _vms
	_owned_by_pool(vm)
	not vm.metadata.deletionTimestamp
}

# The pool's VMs, those being deleted too.
_owned := {vm.metadata.name | some vm in _vms; _owned_by_pool(vm)}

# The VMs whose VMI runs or is on its way (not finished, not going).
_active contains name if {
	some name, _ in _alive
	vmi := _vmis[name]
	not object.get(vmi, ["status", "phase"], "") in {"Succeeded", "Failed"}
	not vmi.metadata.deletionTimestamp
}

_wants_to_run(vm) if vm.spec.running == true

_wants_to_run(vm) if object.get(vm.spec, "runStrategy", "") in {"Always", "RerunOnFailure", "Once"}

# Halted: no VMI runs and none is wanted.
_stopped contains name if {
	some name, vm in _alive
	not name in _active
	not _wants_to_run(vm)
}

# Ready: KubeVirt says so of the VM, and of the VMI it runs (the VMI's Ready condition, which
# a restarted VMI starts without, whatever the VM's status still says).
_ready contains name if {
	some name, vm in _alive
	object.get(vm, ["status", "ready"], false) == true
	name in _active
	some condition in object.get(_vmis[name], ["status", "conditions"], [])
	condition.type == "Ready"
	condition.status == "True"
}

_hash_of(obj) := object.get(obj, ["metadata", "annotations", annotation_template_hash], "")

_current contains name if {
	some name, vm in _alive
	_hash_of(vm) == template_hash
}

# VMs whose VMI KubeVirt starts again when it is deleted: a restart. (A Manual or Once VM
# would stay stopped: it is updated, never restarted; its next start runs the new template.)
_restartable contains name if {
	some name, vm in _alive
	_restarts_by_itself(vm)
}

_restarts_by_itself(vm) if vm.spec.running == true

_restarts_by_itself(vm) if object.get(vm.spec, "runStrategy", "") in {"Always", "RerunOnFailure"}

# The VMs that carry the template once this plan is applied: those updated already and, with
# KubeVirt's semantics (which updates every outdated VM at once and leaves its VMI to wait for a
# restart), those this plan updates.
_will_be_current := _current | {name | some name in _free_updates} if _kubevirt

else := _current

# Updated VMs whose running VMI still comes from an older template.
_restart_pending contains name if {
	some name in _will_be_current
	name in _restartable
	name in _active
	_hash_of(_vmis[name]) != _vmi_template_hash
}

# Restarting this VM makes the pool less available: its VMI runs and KubeVirt reports the VM
# ready (status.ready, as KubeVirt's pool controller reads the VM's Ready condition), even if
# the VMI's own Ready condition is momentarily False. Restarting a VM KubeVirt already reports
# not ready costs nothing.
_restart_disrupts(name) if {
	name in _restartable
	name in _active
	object.get(_alive[name], ["status", "ready"], false) == true
}

# Strategies ----------------------------------------------------------------------------------

_strategy_kinds := ["unmanaged", "opportunistic", "proactive"]

_strategy(field) := strategy if {
	strategy := _spec[field]
	is_object(strategy)
} else := {"proactive": {}}

_kind_of(strategy) := [kind | some kind in _strategy_kinds; kind in object.keys(strategy)][0]

_update_kind := _kind_of(_strategy("updateStrategy"))

_scale_in_kind := _kind_of(_strategy("scaleInStrategy"))

_scale_in := object.get(_strategy("scaleInStrategy"), _scale_in_kind, {})

_state_preservation := object.get(_scale_in, "statePreservation", "Disabled")

_selection_policy(strategy, kind) := object.get(strategy, [kind, "selectionPolicy"], {})

# Selection -----------------------------------------------------------------------------------

_prefer := object.get(_settings, ["random", "prefer"], [])

_in_state(name, "stopped") if name in _stopped

_in_state(name, "notReady") if not name in _ready

_in_state(name, "ready") if name in _ready

# The Random base policy's tier of each VM: the first preferred state it is in.
_tiers := {name: tier |
	some name, _ in _alive
	tier := min(array.concat([i | some i, state in _prefer; _in_state(name, state)], [count(_prefer)]))
}

_created_ns(vm) := time.parse_rfc3339_ns(object.get(vm.metadata, "creationTimestamp", "1970-01-01T00:00:00Z"))

# METADATA
# description: |
#   The stable pseudo-random rank of a VM of this pool: from the pool's UID and the VM's name
#   only, so every pass and every replica of the controller agrees.
random_rank(name) := crypto.sha256(concat("/", [_uid, name]))

# Creation times have a resolution of one second: within one, the VM's number tells the order
# the pool made them in. Keys are computed once per VM, however often VMs are ordered.
_base_keys := {name: {
	"Oldest": [0, created, number],
	"Newest": [0, 0 - created, 0 - number],
	"Random": [_tiers[name], random_rank(name), 0],
	"AscendingOrder": [0, number, 0],
	"DescendingOrder": [0, 0 - number, 0],
} |
	some name, vm in _alive
	created := _created_ns(vm)
	number := object.get(_ordinals, name, 0)
}

_ordinals := {name: n | some name, _ in _alive; n := ordinal(name)}

_group(name, ordered) := 0 if _kubevirt

else := min(array.concat(
	[i | some i, p in ordered; selector_matches(object.get(p, "labelSelector", null), _labels(_alive[name]))],
	[count(ordered)],
))

_labels(obj) := object.get(obj, ["metadata", "labels"], {})

# KubeVirt matches its selectors against the labels of the VM's VMI template.
_selector_labels(vm) := object.get(vm, ["spec", "template", "metadata", "labels"], {})

# METADATA
# description: |
#   The names a selectionPolicy lets scale-in or updates take: all of them, except with
#   KubeVirt's semantics and ordered policies, where only VMs whose VMI template labels match
#   one of the ordered label selectors may be taken.
selectable(names, policy) := names if {
	not _filters(policy)
} else := {name |
	some name in names
	_selects(policy, _selector_labels(_alive[name]))
}

# Whether policy's ordered label selectors let a VM whose VMI template has labels be taken.
_selects(policy, _) if not _filters(policy)

_selects(policy, labels) if {
	_filters(policy)
	some p in policy.orderedPolicies
	selector_matches(object.get(p, "labelSelector", null), labels)
}

_filters(policy) if {
	_kubevirt
	count(object.get(policy, "orderedPolicies", [])) > 0
}

# METADATA
# description: |
#   names ordered as policy (a selectionPolicy) picks them: those matching the first ordered
#   label selector first, then the second, ..., then the rest (with KubeVirt's semantics the
#   selectors filter, see selectable, and do not order); within each group by the base
#   policy (Oldest, Newest: creation time, then number; AscendingOrder, DescendingOrder: the
#   VM's number; Random: preferred states, then random_rank). The name breaks ties.
selection_order(names, policy) := [key[4] | some key in sort([key |
	some name in names
	base := _base_keys[name][object.get(policy, "basePolicy", "Random")]
	key := [_group(name, object.get(policy, "orderedPolicies", [])), base[0], base[1], base[2], name]
])]

# METADATA
# description: Whether a metav1.LabelSelector matches labels; null matches nothing.
selector_matches(selector, labels) if {
	is_object(selector)
	every key, value in object.get(selector, "matchLabels", {}) {
		labels[key] == value
	}
	every expression in object.get(selector, "matchExpressions", []) {
		_expression_matches(expression, labels)
	}
}

_expression_matches(e, labels) if {
	e.operator == "In"
	labels[e.key] in e.values
}

_expression_matches(e, labels) if {
	e.operator == "NotIn"
	not object.get(labels, e.key, null) in e.values
}

_expression_matches(e, labels) if {
	e.operator == "Exists"
	e.key in object.keys(labels)
}

_expression_matches(e, labels) if {
	e.operator == "DoesNotExist"
	not e.key in object.keys(labels)
}

# Scale-in ------------------------------------------------------------------------------------

_excess := count(_alive) - _replicas

_scale_in_candidates := object.keys(_alive) if _scale_in_kind == "proactive"

# Opportunistic: the design deletes halted VMs; KubeVirt none (it waits for VMs deleted
# otherwise).
_scale_in_candidates := _stopped if {
	_scale_in_kind == "opportunistic"
	not _kubevirt
}

_scale_in_candidates := set() if {
	_scale_in_kind == "opportunistic"
	_kubevirt
}

_scale_in_candidates := set() if _scale_in_kind == "unmanaged"

_scale_in_policy := _selection_policy(_strategy("scaleInStrategy"), _scale_in_kind)

_deleted := array.slice(
	selection_order(selectable(_scale_in_candidates, _scale_in_policy), _scale_in_policy),
	0, _excess,
) if _excess > 0

else := []

_deleted_set := {name | some name in _deleted}

_volumes_of(vm) := sort([d.metadata.name | some d in object.get(vm.spec, "dataVolumeTemplates", [])])

_deletes := [{
	"name": name,
	"preserveState": _state_preservation == "Offline",
	"volumes": _volumes_of(_alive[name]),
} |
	some name in _deleted
]
