# VirtualMachinePool plan.
#
# Scale-out (names, reuse of preserved state, burst limit), updates within maxUnavailable,
# autohealing with backoff, the pool's status, and the plan that gathers them. The input is
# described in pool.rego.
package virtrules.pool

_burst_limit := input.burstLimit

_now_ns := time.parse_rfc3339_ns(input.now)

# Names ---------------------------------------------------------------------------------------

# The DataVolumes kept by Offline state preservation, by the VM name they were kept for.
# (A name may have state kept by two pools: one deleted, and one of the same name after it.)
# (The annotations' keys are rules of pool.rego, not variables: Regal's prefer-some-in-iteration,
# which reads each file alone, takes them for an iteration.)
_preserved contains [name, pool_uid] if {
	some volume in object.get(input, "volumes", [])
	name := volume.metadata.annotations[annotation_preserved_vm] # regal ignore:prefer-some-in-iteration,use-some-for-output-vars
	pool_uid := volume.metadata.annotations[annotation_preserved_pool] # regal ignore:prefer-some-in-iteration,use-some-for-output-vars
}

_preserved_here contains name if {
	some [name, pool_uid] in _preserved
	pool_uid == _uid
}

# Names no VM of this pool may take: those of every VM (owned, detached or anyone's) and those
# whose state another pool keeps.
_held := _vm_names | _held_elsewhere

_held_elsewhere contains name if {
	some [name, pool_uid] in _preserved
	pool_uid != _uid
}

# Names to take first: VMs being re-provisioned, then names whose state this pool kept.
_reprovision_pending contains name if {
	some name, _ in _records
	ordinal(name)
	not name in _held
}

_preserved_free contains name if {
	some name in _preserved_here
	ordinal(name)
	not name in _held
	not name in _reprovision_pending
}

# Names with their numbers, [n, name], by number.
_by_ordinal(names) := sort([[ordinal(name), name] | some name in names])

_reusable := array.concat(_by_ordinal(_reprovision_pending), _by_ordinal(_preserved_free))

_reusable_names := _reprovision_pending | _preserved_free

# The VMs the pool's size counts: those alive and, with KubeVirt's semantics, those being
# deleted too (KubeVirt replaces a VM only once it is gone).
_counted := count(_owned) if _kubevirt

else := count(_alive)

_deficit := _replicas - _counted

_create_count := min([_deficit, _burst_limit]) if _deficit > 0

else := 0

_fresh_count := max([0, _create_count - count(_reusable)])

# The numbers of held names and of those reused first: no fresh VM takes them.
_taken := {n | some n in _ordinals} | {n |
	some name in (_held_elsewhere | _reusable_names)
	n := ordinal(name)
}

# The lowest numbers not taken, [n, name].
_fresh := [[n, vm_name(n)] | some n in _fresh_numbers] if _fresh_count > 0

else := []

# When the numbers taken from the first are the first count(_taken) ones (no gaps: a pool that
# never scaled in), the free ones follow them. Otherwise, of the count(_taken) + _fresh_count + 1
# numbers from the first, at most count(_taken) are taken.
_fresh_numbers := numbers.range(_last_taken + 1, _last_taken + _fresh_count) if {
	_last_taken - _first_ordinal == count(_taken) - 1
} else := array.slice(
	sort({n | some n in numbers.range(_first_ordinal, count(_taken) + _fresh_count)} - _taken),
	0, _fresh_count,
)

_last_taken := max(_taken) if {
	min(_taken) >= _first_ordinal
} else := _first_ordinal - 1

_created := array.slice(array.concat(_reusable, _fresh), 0, _create_count)

_creates := [{
	"name": name,
	"vm": vms[i],
	"reuse": object.get(_preserved_volumes, name, []),
} |
	vms := _render([n | some [n, _] in _created])
	some i, [_, name] in _created
]

# The names of the DataVolumes this pool kept, by the VM they were kept for, sorted. (The
# unification binds name in the inner comprehension, so OPA indexes it: one pass over volumes.)
_preserved_volumes[name] := sort(volumes) if {
	some name in _preserved_here
	volumes := [volume.metadata.name |
		some volume in object.get(input, "volumes", [])
		volume.metadata.annotations[annotation_preserved_pool] == _uid # regal ignore:prefer-some-in-iteration
		volume.metadata.annotations[annotation_preserved_vm] = name # regal ignore:prefer-some-in-iteration,prefer-equals-comparison
	]
}

# Preserved volumes whose VM is back: they belong to it again.
_reclaims := [{"volume": volume.metadata.name, "vm": name} |
	some volume in object.get(input, "volumes", [])
	volume.metadata.annotations[annotation_preserved_pool] == _uid # regal ignore:prefer-some-in-iteration
	name := volume.metadata.annotations[annotation_preserved_vm] # regal ignore:prefer-some-in-iteration
	_alive[name]
]

# Updates -------------------------------------------------------------------------------------

# Unset: the design's 25%; KubeVirt's 100%.
_max_unavailable_default := "100%" if _kubevirt

else := "25%"

_max_unavailable_raw := object.get(_spec, "maxUnavailable", _max_unavailable_default)

_max_unavailable_floor := object.get(_settings, "maxUnavailableFloor", 1)

# An integer is taken as it is; KubeVirt raises it to the floor too.
_max_unavailable := _max_unavailable_raw if {
	is_number(_max_unavailable_raw)
	not _kubevirt
}

_max_unavailable := max([_max_unavailable_floor, _max_unavailable_raw]) if {
	is_number(_max_unavailable_raw)
	_kubevirt
}

_max_unavailable := max([_max_unavailable_floor, floor((_replicas * percent) / 100)]) if {
	is_string(_max_unavailable_raw)
	percent := to_number(trim_suffix(_max_unavailable_raw, "%"))
}

_removed := _deleted_set | _reprovisioned

# Not ready now, of the VMs restarts may take (with KubeVirt's semantics, the update selectors
# limit them, and KubeVirt counts no other). A VM whose VMI waits for its restart is available
# until it is restarted.
_unavailable := _restart_scope - _ready

_update_policy := _selection_policy(_strategy("updateStrategy"), _update_kind)

# The VMs updates may touch (with KubeVirt's semantics, the update selectors filter them).
_update_scope := selectable(_names, _update_policy)

_outdated := ((_update_scope - _current) - _removed) & object.keys(_ordinals)

# Outdated VMs that no update makes less available: halted, or not restarted by the update
# (not running, never restarted by the pool, or already reported not ready). KubeVirt updates
# every outdated VM at once, with either strategy: its VMI then waits for a restart.
_update_free := _outdated if {
	_kubevirt
	_update_kind != "unmanaged"
} else := _outdated & _stopped if {
	_update_kind == "opportunistic"
} else := _outdated - _restart_disrupts if {
	_update_kind == "proactive"
} else := set()

_free_updates := array.slice(selection_order(_update_free, _update_policy), 0, _burst_limit)

_free_updated := {name | some name in _free_updates}

# The VMI template labels of VM name once this plan is applied: the template's if the plan
# updates it. KubeVirt's update selectors choose the VMIs to restart by them.
_labels_after(name) := object.get(_vmi_metadata, "labels", {}) if {
	name in _free_updated
} else := _selector_labels(_alive[name])

_restart_scope := _names if {
	not _filters(_update_policy)
} else := {name | some name, _ in _alive; _selects(_update_policy, _labels_after(name))}

# Pending restarts (updated VMs whose VMI runs an older template) are disruptions like any
# other: only those of VMs already reported not ready are free.
_pending := (_restart_pending - _removed) & _restart_scope

_restart_free := _pending - _restart_disrupts

_update_budget := max([0, _max_unavailable - count(_unavailable)])

# The disruptions this pass may cause, at most the budget: pending restarts first (they finish
# updates already begun), then updates of running ready VMs, each in the policy's order.
_disruptive := array.slice(
	array.concat(
		selection_order(_pending - _restart_free, _update_policy),
		selection_order(_outdated - _update_free, _update_policy),
	),
	0, _update_budget,
) if _update_kind == "proactive"

else := []

_updated := array.slice(
	array.concat(_free_updates, [name | some name in _disruptive; name in _outdated; not name in _update_free]),
	0, _burst_limit,
)

_updates := [{"name": name, "vm": vms[i]} |
	vms := _render([n | ordinals := _ordinals; some name in _updated; n := ordinals[name]]) # regal ignore:pointless-reassignment
	some i, name in _updated
]

_restarts := sort(((_restarts_with_update | _restart_free) | {name | some name in _disruptive; name in _pending})) if {
	_update_kind == "proactive"
} else := []

# The design restarts a running VM with its update; KubeVirt leaves its VMI to a later
# restart, within the budget like any pending one (_restart_pending).
_restarts_with_update := set() if _kubevirt

else := {name |
	some name in _updated
	name in _restartable
	name in _active
}

# Autohealing ---------------------------------------------------------------------------------

_autohealing := _spec.autohealing if is_object(_spec.autohealing)

_threshold := object.get(_autohealing, "startupFailureThreshold", 3)

# A comprehension, not an object rule: _records[name] is looked up per failing VM, and OPA
# evaluates an object rule's body again for each key looked up.
_records := {record.name: record | some record in object.get(_pool, ["status", "reprovisions"], [])} # regal ignore:prefer-set-or-object-rule

_failing := _failing_to_start - _deleted_set

# (Without autohealing there is no threshold, and no VM is looked at.)
_failing_to_start contains name if {
	_threshold
	some name, vm in _alive
	object.get(vm, ["status", "startFailure", "consecutiveFailCount"], 0) >= _threshold
}

# KubeVirt's semantics: a VM stuck failing to start, its Ready condition False for at least
# minFailingToStartDuration (measured from the condition's lastProbeTime, as KubeVirt does).
_failing_to_start contains name if {
	_kubevirt
	_autohealing
	some name, vm in _alive
	object.get(vm, ["status", "printableStatus"], "") in _failing_statuses
	some condition in object.get(vm, ["status", "conditions"], [])
	condition.type == "Ready"
	condition.status == "False"
	since := time.parse_rfc3339_ns(condition.lastProbeTime)
	_now_ns - since >= _min_failing_ns
}

_failing_statuses := {
	"CrashLoopBackOff", "ErrorUnschedulable", "ErrImagePull",
	"ImagePullBackOff", "DataVolumeError", "ErrorPvcNotFound",
}

_min_failing_ns := time.parse_duration_ns(_autohealing.minFailingToStartDuration) if {
	is_string(_autohealing.minFailingToStartDuration)
} else := 300000000000

# METADATA
# description: |
#   How long the (n+1)-th re-provisioning of a VM waits after the n-th, in seconds:
#   the initial backoff, doubled each time, at most the maximum.
backoff_seconds(n) := min([
	_settings.autohealing.initialBackoffSeconds * bits.lsh(1, min([n - 1, 30])),
	_settings.autohealing.maxBackoffSeconds,
])

_due_ns(name) := time.parse_rfc3339_ns(_records[name].lastTime) + (backoff_seconds(_records[name].count) * 1000000000)

_reprovisioned contains name if {
	some name in _failing
	not _records[name]
}

_reprovisioned contains name if {
	some name in _failing
	_now_ns >= _due_ns(name)
}

_backing_off contains name if {
	some name in _failing
	not name in _reprovisioned
}

_reprovisions := [{"name": name, "volumes": _volumes_of(_alive[name])} | some name in sort(_reprovisioned)]

# The re-provisioning records the pool's status keeps: one more for each VM re-provisioned now;
# a VM that came back ready starts again from the initial backoff.
_new_records := sort([record |
	some name in _reprovisioned
	record := {"name": name, "count": object.get(_records, [name, "count"], 0) + 1, "lastTime": input.now}
]) if _autohealing

else := []

_kept_records := [record |
	some name, record in _records
	not name in _reprovisioned
	not name in _ready
	_autohealing
]

# Status --------------------------------------------------------------------------------------

_status := {
	"replicas": count(_alive),
	"readyReplicas": count(_ready),
	"updatedReplicas": count(_current),
	"labelSelector": concat("=", [label_pool, _name]),
}

_condition(type, true, reason, message) := {"type": type, "status": "True", "reason": reason, "message": message}

_condition(type, false, reason, message) := {"type": type, "status": "False", "reason": reason, "message": message}

_scaled := _condition("Scaled", true, "ReplicasMatch", sprintf("%d of %d VMs", [count(_alive), _replicas])) if {
	_deficit == 0
} else := _condition("Scaled", false, "ScalingOut", sprintf("%d of %d VMs, creating %d", [count(_alive), _replicas, count(_creates)])) if {
	_deficit > 0
} else := _condition("Scaled", false, "ScalingIn", sprintf("%d of %d VMs, deleting %d", [count(_alive), _replicas, count(_deletes)])) if {
	count(_deletes) > 0
} else := _condition("Scaled", false, "ScaleInBlocked", sprintf(
	"%d of %d VMs; the %s scale-in strategy deletes none now",
	[count(_alive), _replicas, _scale_in_kind],
))

_up_to_date := _condition("Updated", true, "TemplateApplied", sprintf("%d VMs run template %s", [count(_alive), template_hash])) if {
	count(_current) == count(_alive)
} else := _condition("Updated", false, "Updating", sprintf("%d of %d VMs updated to template %s", [count(_current), count(_alive), template_hash])) if {
	count(_updates) + count(_restarts) > 0
} else := _condition("Updated", false, "UpdateBlocked", sprintf(
	"%d of %d VMs updated to template %s; the %s update strategy updates none now (maxUnavailable %d, unavailable %d)",
	[count(_current), count(_alive), template_hash, _update_kind, _max_unavailable, count(_unavailable)],
))

_all_ready := _condition("Ready", true, "AllReady", sprintf("%d of %d VMs ready", [count(_ready), _replicas])) if {
	count(_ready) == _replicas
	count(_alive) == _replicas
} else := _condition("Ready", false, "NotAllReady", sprintf("%d of %d VMs ready", [count(_ready), _replicas]))

# Requeue -------------------------------------------------------------------------------------

_requeue_after := array.concat([0 | _deficit > _create_count], [0 | count(_updated) == _burst_limit; count(_outdated) > _burst_limit])

_requeue_backoff := [ceil((_due_ns(name) - _now_ns) / 1000000000) | some name in _backing_off]

_requeue_after_seconds := min(array.concat(_requeue_after, _requeue_backoff)) if {
	count(array.concat(_requeue_after, _requeue_backoff)) > 0
} else := null

# The plan ------------------------------------------------------------------------------------

# METADATA
# description: |
#   The plan for input.pool: create (name, the VM, preserved volumes it takes back), delete
#   (name, whether its state is kept, its volumes), update (name, the VM as it should be),
#   restart (names whose VMI must be restarted, after their update), reprovision (name, the
#   volumes deleted with it), reclaim (preserved volumes whose VM is back), requeueAfterSeconds
#   (null: only changes wake the pool), the status counts and conditions, and the re-provisioning
#   records for the status. With an invalid pool: errors only, "field: message".
plan := {"errors": sort(errors)} if {
	count(errors) > 0
} else := {
	"create": _creates,
	"delete": _deletes,
	"update": _updates,
	"restart": _restarts,
	"reprovision": _reprovisions,
	"reclaim": _reclaims,
	"requeueAfterSeconds": _requeue_after_seconds,
	"status": _status,
	"conditions": [_scaled, _up_to_date, _all_ready],
	"reprovisions": array.concat(_kept_records, _new_records),
}
