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
#     semantics:  optional, "default" or "kubevirt": overrides settings.semantics for this plan
#                 (eval's preview of KubeVirt's own pool.kubevirt.io pools asks for "kubevirt")
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

_settings_semantics := object.get(_settings, "semantics", "default")

# The semantics a plan follows: the input's when it names one (eval previews KubeVirt's own
# pool.kubevirt.io pools with "kubevirt" whatever the settings say), else the settings'.
_semantics := input.semantics if is_string(input.semantics)

else := _settings_semantics

# KubeVirt's own pool semantics (settings.semantics: kubevirt).
_kubevirt if _semantics == "kubevirt"

# The number of the pool's first VM: the design's "<pool>-1", KubeVirt's "<pool>-0".
_first_ordinal := 0 if _kubevirt

else := 1

# METADATA
# scope: document
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
	not _settings_semantics in {"default", "kubevirt"}
	msg := sprintf("settings.semantics: %v must be \"default\" or \"kubevirt\"", [_settings_semantics])
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
# scope: document
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

# The numbers of the VMs named "<pool>-<n>" (as ordinal), by name, without a step per VM: a
# regular expression finds the names, a line each, and writes each as the JSON object entry
# "<name>": <n>, which json.unmarshal reads at once. (A name is one line: a match that is not a
# whole name, in a name with a line break, is no VM's: object.filter drops it.)
_ordinals := object.union(
	object.filter(json.unmarshal(concat("", ["{", _ordinal_entries, "}"])), _vm_names),
	{name: 0 | _kubevirt; name := vm_name(0); name in _vm_names},
)

_ordinal_entries := replace(
	regex.replace(
		concat("\n", regex.find_n(_ordinal_pattern, concat("\n", _vm_names), -1)),
		_ordinal_pattern, _ordinal_entry,
	),
	"\n", ",",
)

# The JSON object entry of a matched name: the prefix as JSON writes it (and with "$" as "$$",
# which regex.replace expands to "$"), the number, a colon and the number again.
_ordinal_entry := concat("", [
	"\"",
	replace(trim_suffix(trim_prefix(json.marshal(_prefix), "\""), "\""), "$", "$$"),
	"${2}\":${2}",
])

# A line that is the pool's prefix, quoted, and a number from 1 without leading zeros.
_ordinal_pattern := concat("", [`(?m)^(`, regex.replace(_prefix, `[\\.+*?()|\[\]{}^$]`, `\$0`), `([1-9][0-9]*))$`])

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

_vm_names contains vm.metadata.name if some vm in _vms

# _vmis and _owned_vms are comprehensions, not object rules: they are looked up per VM, and OPA
# evaluates an object rule's body again for each key looked up (VMs x VMs, BenchmarkPoolPlan).
_vmis := {vmi.metadata.name: vmi | some vmi in object.get(input, "vmis", [])} # regal ignore:prefer-set-or-object-rule

# The per-VM rules below run once for each of a pool's VMs (thousands of them), so they are
# written for OPA's evaluator: each a single pass of plain references and comparisons (a
# builtin call such as object.get costs several times a reference, a rule named inside a loop
# an evaluation of its own: such values are bound before the loop), no function call or
# negation per VM, and set operations (which OPA runs natively) wherever a set is derived from
# others. A test that fails for most VMs is a comparison ("!= null", "in"), not a reference
# alone or a set lookup, which cost OPA several allocations each time they come out undefined. A field that may be absent is tested where present and the set subtracted: "not
# being deleted" is _owned_vms without _deleting.

# The pool's VMs, those being deleted too: a controller ownerReference with the pool's UID.
_owned_vms := {vm.metadata.name: vm | # regal ignore:prefer-set-or-object-rule
	uid := _uid # regal ignore:pointless-reassignment
	some vm in _vms
	some ref in vm.metadata.ownerReferences
	ref.uid == uid
	ref.controller == true
	ref.kind == "VirtualMachinePool"
}

_owned := object.keys(_owned_vms)

# The pool's VMs being deleted (deletionTimestamp set).
_deleting contains name if {
	some name, vm in _owned_vms
	vm.metadata.deletionTimestamp != null
}

# The pool's VMs that count: owned, not being deleted. A detached VM (its ownerReference
# removed) is never counted again, whatever its labels.
_alive := object.remove(_owned_vms, _deleting)

_names := object.keys(_alive)

_finished_phases := {"Succeeded", "Failed"}

# The VMs whose VMI runs or is on its way (not finished, not going).
_active := (_names & object.keys(_vmis)) - _vmis_ending

# VMIs finished or being deleted.
_vmis_ending contains name if {
	phases := _finished_phases # regal ignore:pointless-reassignment
	some name, vmi in _vmis
	vmi.status.phase in phases
}

_vmis_ending contains name if {
	some name, vmi in _vmis
	vmi.metadata.deletionTimestamp != null
}

# VMs whose VMI KubeVirt starts again when it is deleted: a restart. (A Manual or Once VM
# would stay stopped: it is updated, never restarted; its next start runs the new template.)
_restartable contains name if {
	some name, vm in _alive
	vm.spec.running == true
}

_restartable contains name if {
	strategies := _restarting_strategies # regal ignore:pointless-reassignment
	some name, vm in _alive
	vm.spec.runStrategy in strategies
}

_restarting_strategies := {"Always", "RerunOnFailure"}

# Halted: no VMI runs and none is wanted (KubeVirt restarts it, or it is started once). Only
# the VMs without a VMI are looked at: usually few.
_stopped := (_inactive - _restartable) - {name | some name in _inactive; _alive[name].spec.runStrategy == "Once"}

_inactive := _names - _active

# Ready: KubeVirt says so of the VM, and of the VMI it runs (the VMI's Ready condition, which
# a restarted VMI starts without, whatever the VM's status still says).
_ready contains name if {
	vmis := _vmis # regal ignore:pointless-reassignment
	some name in (_reported_ready & _active)
	some condition in vmis[name].status.conditions
	condition.type == "Ready"
	condition.status == "True"
}

# The VMs KubeVirt reports ready (status.ready, as KubeVirt's pool controller reads the VM's
# Ready condition).
_reported_ready contains name if {
	some name, vm in _alive
	vm.status.ready == true
}

# The VMs that carry the template's hash.
_current contains name if {
	key := annotation_template_hash # regal ignore:pointless-reassignment
	hash := template_hash # regal ignore:pointless-reassignment
	some name, vm in _alive
	vm.metadata.annotations[key] == hash
}

# The VMs that carry the template once this plan is applied: those updated already and, with
# KubeVirt's semantics (which updates every outdated VM at once and leaves its VMI to wait for a
# restart), those this plan updates.
_will_be_current := _current | _free_updated if _kubevirt

else := _current

# Updated VMs whose running VMI still comes from an older template: those running, less those
# whose VMI carries the hash of the template's VMI.
_restart_pending := _running_current - {name |
	key := annotation_template_hash # regal ignore:pointless-reassignment
	hash := _vmi_template_hash # regal ignore:pointless-reassignment
	vmis := _vmis # regal ignore:pointless-reassignment
	some name in _running_current
	vmis[name].metadata.annotations[key] == hash
}

_running_current := (_will_be_current & _restartable) & _active

# Restarting these VMs makes the pool less available: their VMI runs and KubeVirt reports them
# ready, even if the VMI's own Ready condition is momentarily False. Restarting a VM KubeVirt
# already reports not ready costs nothing.
_restart_disrupts := (_restartable & _active) & _reported_ready

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

# Scale-in ------------------------------------------------------------------------------------

_excess := count(_alive) - _replicas

_scale_in_candidates := _names if _scale_in_kind == "proactive"

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
