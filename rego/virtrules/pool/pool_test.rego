package virtrules.pool_test

import data.virtrules.pool

# Helpers ---------------------------------------------------------------------------------------

_now := "2026-01-01T00:10:00Z"

_template := {
	"metadata": {"labels": {"app": "db"}},
	"spec": {
		"running": true,
		"dataVolumeTemplates": [{"metadata": {"name": "dv"}, "spec": {"pvc": {}}}],
		"template": {"spec": {"volumes": [
			{"name": "disk", "dataVolume": {"name": "dv"}},
			{"name": "cloudinit", "cloudInitNoCloud": {"secretRef": {"name": "userdata"}, "networkDataSecretRef": {"name": "net"}}},
			{"name": "cfg", "configMap": {"name": "settings"}},
			{"name": "scratch", "persistentVolumeClaim": {"claimName": "shared"}},
		]}},
	},
}

_pool(spec) := {
	"apiVersion": "pool.virt-rules.io/v1alpha1",
	"kind": "VirtualMachinePool",
	"metadata": {"name": "my-vm", "namespace": "ns", "uid": "pool-uid"},
	"spec": object.union({"replicas": 3, "template": _template}, spec),
}

_owner := {"apiVersion": "pool.virt-rules.io/v1alpha1", "kind": "VirtualMachinePool", "name": "my-vm", "uid": "pool-uid", "controller": true}

_hash := hash if {
	hash := pool.template_hash with input as {"pool": _pool({})}
}

# VM number n of the pool, made from the current template, running and ready.
_vm(n) := {
	"metadata": {
		"name": sprintf("my-vm-%d", [n]),
		"labels": {"app": "db"},
		"annotations": {"pool.virt-rules.io/template-hash": _hash},
		"creationTimestamp": sprintf("2026-01-01T00:00:%02dZ", [n]),
		"ownerReferences": [_owner],
	},
	"spec": {"running": true, "dataVolumeTemplates": [{"metadata": {"name": sprintf("dv-%d", [n])}}]},
	"status": {"ready": true},
}

_vmi(n) := {
	"metadata": {
		"name": sprintf("my-vm-%d", [n]),
		"annotations": {"pool.virt-rules.io/template-hash": _hash},
	},
	"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}

_with(obj, patch) := object.union(obj, patch)

_stopped(n) := _with(_vm(n), {"spec": {"running": false}, "status": {"ready": false}})

_not_ready(n) := _with(_vm(n), {"status": {"ready": false}})

_outdated(n) := _with(_vm(n), {"metadata": {"annotations": {"pool.virt-rules.io/template-hash": "old"}}})

_labelled(vm, labels) := _with(vm, {"metadata": {"labels": labels}})

_input(p, vms, vmis) := {"pool": p, "vms": vms, "vmis": vmis, "volumes": [], "now": _now, "burstLimit": 250}

# The design's semantics, pinned so that these tests also pass in an admin's bundle that
# selects KubeVirt's (pool_kubevirt_test.rego tests those).
_plan(p, vms, vmis) := _plan_of(_input(p, vms, vmis))

_plan_of(doc) := plan if {
	plan := pool.plan with input as doc with pool.settings.semantics as "default"
}

# Tests that rely on the shipped Random preference pin it, so that they still pass in an
# admin's bundle that changes it by data (examples/custom-bundle).
_shipped_prefer := ["stopped", "notReady"]

_shipped_plan(p, vms, vmis) := plan if {
	plan := pool.plan with input as _input(p, vms, vmis)
		with pool.settings.random.prefer as _shipped_prefer
		with pool.settings.semantics as "default"
}

_names(entries) := [e.name | some e in entries]

_running(ns) := [_vmi(n) | some n in ns]

_preserved(name, vm, pool_uid) := {"metadata": {
	"name": name,
	"labels": {"pool.virt-rules.io/preserved": "my-vm"},
	"annotations": {"pool.virt-rules.io/preserved-pool-uid": pool_uid, "pool.virt-rules.io/preserved-vm": vm},
}}

_condition(plan, type) := [c | some c in plan.conditions; c.type == type][0]

# Names -----------------------------------------------------------------------------------------

test_seed_naming_example_scale_in_then_out if {
	# Three VMs, my-vm-2 stopped: scale-in to 2 takes it (Random puts stopped VMs first).
	vms := [_vm(1), _stopped(2), _vm(3)]
	down := _shipped_plan(_pool({"replicas": 2}), vms, _running([1, 3]))
	_names(down.delete) == ["my-vm-2"]
	down.create == []

	# Back to 4: the gap first, then the next number.
	up := _plan(_pool({"replicas": 4}), [_vm(1), _vm(3)], _running([1, 3]))
	_names(up.create) == ["my-vm-2", "my-vm-4"]
	up.delete == []
	_condition(up, "Scaled").reason == "ScalingOut"
}

test_names_start_at_one if {
	p := _plan(_pool({"replicas": 3}), [], [])
	_names(p.create) == ["my-vm-1", "my-vm-2", "my-vm-3"]
}

test_detached_vm_holds_its_name_and_is_not_counted if {
	detached := _with(_vm(2), {"metadata": {"ownerReferences": []}})
	p := _plan(_pool({"replicas": 3}), [_vm(1), detached, _vm(3)], _running([1, 2, 3]))
	_names(p.create) == ["my-vm-4"]
	p.status.replicas == 2
}

test_vm_of_another_owner_or_going_holds_its_name if {
	other := _with(_vm(1), {"metadata": {"ownerReferences": [object.union(_owner, {"uid": "other"})]}})
	going := _with(_vm(2), {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
	p := _plan(_pool({"replicas": 1}), [other, going], [])
	_names(p.create) == ["my-vm-3"]
}

test_state_kept_by_another_pool_holds_its_name if {
	doc := object.union(_input(_pool({"replicas": 2}), [], []), {"volumes": [_preserved("dv-1", "my-vm-1", "other-uid")]})
	p := _plan_of(doc)
	_names(p.create) == ["my-vm-2", "my-vm-3"]
}

test_state_kept_by_this_and_another_pool_holds_the_name if {
	doc := object.union(_input(_pool({"replicas": 1}), [], []), {"volumes": [
		_preserved("dv-1", "my-vm-1", "pool-uid"),
		_preserved("old-dv-1", "my-vm-1", "deleted-pool-uid"),
	]})
	p := _plan_of(doc)
	_names(p.create) == ["my-vm-2"]
}

test_names_with_kept_state_come_first if {
	doc := object.union(_input(_pool({"replicas": 3}), [_vm(1)], _running([1])), {"volumes": [
		_preserved("dv-5", "my-vm-5", "pool-uid"),
		_preserved("dv-9", "my-vm-9", "pool-uid"),
	]})
	p := _plan_of(doc)
	_names(p.create) == ["my-vm-5", "my-vm-9"]
	p.create[0].reuse == ["dv-5"]
}

test_kept_state_whose_vm_is_back_is_reclaimed if {
	doc := object.union(_input(_pool({"replicas": 1}), [_vm(1)], _running([1])), {"volumes": [
		_preserved("dv-1", "my-vm-1", "pool-uid"),
		_preserved("dv-2", "my-vm-2", "other-uid"),
	]})
	p := _plan_of(doc)
	p.reclaim == [{"volume": "dv-1", "vm": "my-vm-1"}]
}

test_burst_limit_caps_creates_and_requeues if {
	doc := object.union(_input(_pool({"replicas": 30}), [], []), {"burstLimit": 25})
	p := _plan_of(doc)
	count(p.create) == 25
	p.create[24].name == "my-vm-25"
	p.requeueAfterSeconds == 0

	q := _plan_of(object.union(doc, {"vms": [_vm(n) | some n in numbers.range(1, 25)]}))
	_names(q.create) == [sprintf("my-vm-%d", [n]) | some n in numbers.range(26, 30)]
	q.requeueAfterSeconds == null
}

test_ordinal_only_for_the_pools_own_names if {
	ordinals := [n | some name in ["my-vm-12", "my-vm-012", "other-1", "my-vm-"]; n := pool.ordinal(name)] with input as {"pool": _pool({})}
	ordinals == [12]
}

# The numbers of all VMs at once agree with ordinal: the pool's name is matched literally (a "."
# in it is no wildcard), a number has no leading zero, and a name is matched whole, even one
# with a line break.
test_ordinals_of_all_vms_are_each_ones_ordinal if {
	names := ["db.v1-3", "db.v1-012", "dbxv1-4", "db.v1-", "db.v1-7\ndb.v1-8", "x\ndb.v1-9", "db.v1-10"]
	doc := {"pool": object.union(_pool({}), {"metadata": {"name": "db.v1"}}), "vms": [{"metadata": {"name": n}} | some n in names]}
	ordinals := pool._ordinals with input as doc
	ordinals == {"db.v1-3": 3, "db.v1-10": 10}
	ordinals == {name: n | some name in names; n := pool.ordinal(name)} with input as doc
}

# A pool name that JSON or a regular expression's replacement would read otherwise ("$", a
# quote, a backslash) is taken literally too.
test_ordinals_of_a_name_with_special_characters if {
	prefix := `a$1"b\c`
	names := [concat("", [prefix, "-4"]), concat("", [prefix, "-04"]), "a-5"]
	doc := {"pool": object.union(_pool({}), {"metadata": {"name": prefix}}), "vms": [{"metadata": {"name": n}} | some n in names]}
	ordinals := pool._ordinals with input as doc
	ordinals == {names[0]: 4}
}

# The lowest free numbers, with gaps below the highest taken and without.
test_fresh_numbers_fill_gaps_then_follow if {
	without_gaps := _plan(_pool({"replicas": 5}), [_vm(1), _vm(2), _vm(3)], _running([1, 2, 3]))
	_names(without_gaps.create) == ["my-vm-4", "my-vm-5"]
	with_gaps := _plan(_pool({"replicas": 5}), [_vm(2), _vm(5), _vm(6)], _running([2, 5, 6]))
	_names(with_gaps.create) == ["my-vm-1", "my-vm-3"]
}

# Rendering -------------------------------------------------------------------------------------

test_vm_gets_unique_volume_names_label_hash_and_owner if {
	p := _plan(_pool({"replicas": 1}), [], [])
	vm := p.create[0].vm
	vm.metadata.name == "my-vm-1"
	vm.metadata.namespace == "ns"
	vm.metadata.labels == {"app": "db", "pool.virt-rules.io/pool": "my-vm"}
	vm.metadata.annotations["pool.virt-rules.io/template-hash"] == _hash
	vm.metadata.ownerReferences[0].uid == "pool-uid"
	vm.metadata.ownerReferences[0].controller == true
	vm.spec.dataVolumeTemplates[0].metadata.name == "dv-1"
	vm.spec.dataVolumeTemplates[0].spec == {"pvc": {}}
	vm.spec.template.metadata.annotations["pool.virt-rules.io/template-hash"] == _hash
	volumes := {v.name: v | some v in vm.spec.template.spec.volumes}
	volumes.disk.dataVolume.name == "dv-1"

	# Without nameGeneration, Secret and ConfigMap references are shared; so is a PVC that
	# is not a DataVolumeTemplate's.
	volumes.cloudinit.cloudInitNoCloud.secretRef.name == "userdata"
	volumes.cfg.configMap.name == "settings"
	volumes.scratch.persistentVolumeClaim.claimName == "shared"
}

test_name_generation_postfixes_secret_and_configmap_references if {
	p := _plan(
		_pool({"replicas": 1, "nameGeneration": {
			"appendPostfixToSecretReferences": true,
			"appendPostfixToConfigMapReferences": true,
		}}),
		[], [],
	)
	volumes := {v.name: v | some v in p.create[0].vm.spec.template.spec.volumes}
	volumes.cloudinit.cloudInitNoCloud.secretRef.name == "userdata-1"
	volumes.cloudinit.cloudInitNoCloud.networkDataSecretRef.name == "net-1"
	volumes.cfg.configMap.name == "settings-1"
	volumes.disk.dataVolume.name == "dv-1"
}

test_template_without_volumes_or_data_volumes_renders_as_is if {
	bare := {"spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}}
	p := _plan(json.patch(_pool({"replicas": 1}), [{"op": "replace", "path": "/spec/template", "value": bare}]), [], [])
	p.create[0].vm.spec.runStrategy == "Halted"
	not p.create[0].vm.spec.dataVolumeTemplates
	not p.create[0].vm.spec.template.spec.volumes
}

# Scale-in --------------------------------------------------------------------------------------

test_unmanaged_scale_in_never_deletes if {
	p := _plan(_pool({"replicas": 1, "scaleInStrategy": {"unmanaged": {}}}), [_vm(1), _stopped(2)], _running([1]))
	p.delete == []
	_condition(p, "Scaled").reason == "ScaleInBlocked"
}

test_opportunistic_scale_in_deletes_halted_vms_only if {
	strategy := {"scaleInStrategy": {"opportunistic": {"statePreservation": "Offline"}}}
	p := _plan(_pool(object.union({"replicas": 1}, strategy)), [_vm(1), _stopped(2), _vm(3)], _running([1, 3]))
	p.delete == [{"name": "my-vm-2", "preserveState": true, "volumes": ["dv-2"]}]
	_condition(p, "Scaled").reason == "ScalingIn"
}

# A VM waiting for a VMI is not halted: KubeVirt starts it (Always, RerunOnFailure, running) or
# starts it once (Once). Manual and running: false are halted.
test_vms_waiting_for_a_vmi_are_not_halted if {
	strategy := {"scaleInStrategy": {"opportunistic": {}}}
	vms := [
		_with(_vm(1), {"spec": {"running": null, "runStrategy": "Once"}}),
		_with(_vm(2), {"spec": {"running": null, "runStrategy": "Always"}}),
		_with(_vm(3), {"spec": {"running": null, "runStrategy": "RerunOnFailure"}}),
		_vm(4),
		_with(_vm(5), {"spec": {"running": null, "runStrategy": "Manual"}}),
		_stopped(6),
	]
	p := _plan(_pool(object.union({"replicas": 0}, strategy)), vms, [])
	_names(p.delete) == ["my-vm-5", "my-vm-6"]
}

test_proactive_scale_in_disabled_state_deletes_volumes if {
	p := _shipped_plan(_pool({"replicas": 2, "scaleInStrategy": {"proactive": {"statePreservation": "Disabled"}}}), [_vm(1), _vm(2), _not_ready(3)], _running([1, 2, 3]))
	p.delete == [{"name": "my-vm-3", "preserveState": false, "volumes": ["dv-3"]}]
}

test_ordered_label_selectors_go_first_in_order if {
	policy := {"selectionPolicy": {
		"orderedPolicies": [
			{"labelSelector": {"matchLabels": {"tier": "scratch"}}},
			{"labelSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["batch"]}]}},
		],
		"basePolicy": "Oldest",
	}}
	vms := [_vm(1), _labelled(_vm(2), {"tier": "batch"}), _labelled(_vm(3), {"tier": "scratch"}), _vm(4), _labelled(_vm(5), {"tier": "batch"})]
	p := _plan(_pool({"replicas": 2, "scaleInStrategy": {"proactive": policy}}), vms, _running([1, 2, 3, 4, 5]))
	_names(p.delete) == ["my-vm-3", "my-vm-2", "my-vm-5"]
}

test_same_second_creations_follow_the_vm_numbers if {
	same := [_with(_vm(n), {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}}) | some n in [10, 9, 11]]
	oldest := _plan(_pool({"replicas": 1, "scaleInStrategy": {"proactive": {"selectionPolicy": {"basePolicy": "Oldest"}}}}), same, _running([9, 10, 11]))
	_names(oldest.delete) == ["my-vm-9", "my-vm-10"]
	newest := _plan(_pool({"replicas": 1, "scaleInStrategy": {"proactive": {"selectionPolicy": {"basePolicy": "Newest"}}}}), same, _running([9, 10, 11]))
	_names(newest.delete) == ["my-vm-11", "my-vm-10"]
}

test_base_policies_oldest_and_newest if {
	vms := [_vm(3), _vm(1), _vm(2)]
	oldest := _plan(_pool({"replicas": 1, "scaleInStrategy": {"proactive": {"selectionPolicy": {"basePolicy": "Oldest"}}}}), vms, _running([1, 2, 3]))
	_names(oldest.delete) == ["my-vm-1", "my-vm-2"]
	newest := _plan(_pool({"replicas": 1, "scaleInStrategy": {"proactive": {"selectionPolicy": {"basePolicy": "Newest"}}}}), vms, _running([1, 2, 3]))
	_names(newest.delete) == ["my-vm-3", "my-vm-2"]
}

_scale_in_to_one_by(base) := {"replicas": 1, "scaleInStrategy": {"proactive": {"selectionPolicy": {"basePolicy": base}}}}

test_base_policies_ascending_and_descending_order if {
	# By the VM's number, whatever its creation time (KubeVirt's AscendingOrder and
	# DescendingOrder): my-vm-10 was made before my-vm-2.
	vms := [_vm(2), _with(_vm(10), {"metadata": {"creationTimestamp": "2025-12-31T00:00:00Z"}}), _vm(3)]
	ascending := _plan(_pool(_scale_in_to_one_by("AscendingOrder")), vms, _running([2, 3, 10]))
	_names(ascending.delete) == ["my-vm-2", "my-vm-3"]
	descending := _plan(_pool(_scale_in_to_one_by("DescendingOrder")), vms, _running([2, 3, 10]))
	_names(descending.delete) == ["my-vm-10", "my-vm-3"]
}

test_random_is_stable_and_takes_stopped_then_not_ready_first if {
	vms := [_vm(1), _vm(2), _not_ready(3), _vm(4), _stopped(5), _vm(6)]
	p := _shipped_plan(_pool({"replicas": 1}), vms, _running([1, 2, 3, 4, 6]))
	names := _names(p.delete)
	array.slice(names, 0, 2) == ["my-vm-5", "my-vm-3"]

	# The ready ones follow the pool UID's pseudo-random order of their names.
	ranks := [pool.random_rank(n) | some n in array.slice(names, 2, 6)] with input.pool as _pool({"replicas": 1})
	ranks == sort(ranks)
	pool.random_rank("my-vm-1") == crypto.sha256("pool-uid/my-vm-1") with input.pool as _pool({"replicas": 1})

	# Order-independent: the same VMs listed the other way round decide the same.
	reversed := [vms[(count(vms) - 1) - i] | some i, _ in vms]
	_names(_shipped_plan(_pool({"replicas": 1}), reversed, _running([1, 2, 3, 4, 6])).delete) == names
}

test_random_preference_is_bundle_data if {
	vms := [_vm(1), _stopped(2), _not_ready(3)]
	p := _plan(_pool({"replicas": 2}), vms, _running([1, 3])) with pool.settings.random.prefer as ["ready"]
	_names(p.delete) == ["my-vm-1"]
	q := _plan(_pool({"replicas": 2}), vms, _running([1, 3])) with pool.settings.random.prefer as ["notReady", "stopped"]
	_names(q.delete) == ["my-vm-2"]
}

test_label_selector_operators if {
	labels := {"tier": "db", "zone": "a"}
	pool.selector_matches({}, labels)
	pool.selector_matches({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}]}, labels)
	pool.selector_matches({"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["x"]}]}, labels)
	pool.selector_matches({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, labels)
	pool.selector_matches({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, labels)
	not pool.selector_matches({"matchExpressions": [{"key": "tier", "operator": "Exists"}, {"key": "zone", "operator": "DoesNotExist"}]}, labels)
	not pool.selector_matches({"matchLabels": {"tier": "web"}}, labels)
	not pool.selector_matches(null, labels)
}

# Updates ---------------------------------------------------------------------------------------

test_unmanaged_update_never_touches_vms if {
	p := _plan(_pool({"updateStrategy": {"unmanaged": {}}}), [_outdated(1), _with(_stopped(2), _outdated(2)), _vm(3)], _running([1, 3]))
	p.update == []
	p.restart == []
	_condition(p, "Updated").reason == "UpdateBlocked"
	p.status.updatedReplicas == 1
}

test_opportunistic_update_takes_halted_vms_only if {
	halted := object.union(_outdated(2), {"spec": {"running": false}, "status": {"ready": false}})
	p := _plan(_pool({"updateStrategy": {"opportunistic": {}}}), [_outdated(1), halted, _vm(3)], _running([1, 3]))
	_names(p.update) == ["my-vm-2"]
	p.update[0].vm.metadata.annotations["pool.virt-rules.io/template-hash"] == _hash
	p.restart == []
	_condition(p, "Updated").reason == "Updating"
}

test_proactive_update_restarts_within_max_unavailable if {
	vms := [_outdated(n) | some n in numbers.range(1, 4)]
	p := _plan(_pool({"replicas": 4, "maxUnavailable": 2}), vms, _running([1, 2, 3, 4]))
	count(p.update) == 2
	p.restart == sort(_names(p.update))
}

test_already_unready_vms_use_the_budget if {
	vms := array.concat([_outdated(n) | some n in numbers.range(1, 3)], [_not_ready(4)])
	p := _plan(_pool({"replicas": 4, "maxUnavailable": 1}), vms, _running([1, 2, 3, 4]))
	p.update == []
	_condition(p, "Updated").reason == "UpdateBlocked"
}

test_unready_and_halted_outdated_vms_update_without_budget if {
	halted := object.union(_outdated(2), {"spec": {"running": false}, "status": {"ready": false}})
	unready := object.union(_outdated(3), {"status": {"ready": false}})
	p := _plan(_pool({"replicas": 3, "maxUnavailable": 0}), [_outdated(1), halted, unready], _running([1, 3]))
	_names(p.update) == ["my-vm-2", "my-vm-3"]
	p.restart == ["my-vm-3"]
}

test_manual_vms_are_updated_but_never_restarted if {
	manual := object.union(_outdated(1), {"spec": {"running": null, "runStrategy": "Manual"}})
	p := _plan(_pool({"replicas": 2, "maxUnavailable": 0}), [manual, _outdated(2)], _running([1, 2]))
	_names(p.update) == ["my-vm-1"]
	p.restart == []

	# Updated, its old VMI is not a pending restart and blocks nothing.
	current := object.union(_vm(1), {"spec": {"running": null, "runStrategy": "Manual"}})
	old_vmi := object.union(_vmi(1), {"metadata": {"annotations": {"pool.virt-rules.io/template-hash": "old"}}})
	q := _plan(_pool({"replicas": 2, "maxUnavailable": 1}), [current, _outdated(2)], [old_vmi, _vmi(2)])
	_names(q.update) == ["my-vm-2"]
	q.restart == ["my-vm-2"]
}

_old_vmi(n) := object.union(_vmi(n), {"metadata": {"annotations": {"pool.virt-rules.io/template-hash": "old"}}})

test_updated_vm_with_old_vmi_is_restarted_first_within_the_budget if {
	p := _plan(_pool({"replicas": 2, "maxUnavailable": 1}), [_vm(1), _outdated(2)], [_old_vmi(1), _vmi(2)])
	p.restart == ["my-vm-1"]
	p.update == []
	_condition(p, "Updated").reason == "Updating"

	# With room for two, the outdated VM follows.
	q := _plan(_pool({"replicas": 2, "maxUnavailable": 2}), [_vm(1), _outdated(2)], [_old_vmi(1), _vmi(2)])
	q.restart == ["my-vm-1", "my-vm-2"]
	_names(q.update) == ["my-vm-2"]
}

# Issue 15: updated VMs whose VMIs run the old template were all restarted at once.
test_pending_restarts_count_against_max_unavailable if {
	vms := [_vm(n) | some n in numbers.range(1, 4)]
	vmis := [_old_vmi(n) | some n in numbers.range(1, 4)]
	p := _plan(_pool({"replicas": 4, "maxUnavailable": "25%"}), vms, vmis)
	count(p.restart) == 1
	p.update == []
	p.status.readyReplicas == 4

	# Oldest takes my-vm-1 (the fixtures' creation times follow the numbers).
	oldest := {"proactive": {"selectionPolicy": {"basePolicy": "Oldest"}}}
	q := _plan(_pool({"replicas": 4, "maxUnavailable": 2, "updateStrategy": oldest}), vms, vmis)
	q.restart == ["my-vm-1", "my-vm-2"]
}

test_pending_restarts_wait_while_a_vmi_is_not_ready if {
	# The VM still reports ready, its VMI does not: unavailable, and the budget is spent.
	vms := [_vm(n) | some n in numbers.range(1, 4)]
	flapping := object.union(_old_vmi(4), {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
	vmis := array.concat([_old_vmi(n) | some n in numbers.range(1, 3)], [flapping])
	p := _plan(_pool({"replicas": 4, "maxUnavailable": "25%"}), vms, vmis)
	p.restart == []
}

test_pending_restart_of_a_vm_reported_not_ready_is_free if {
	vms := array.concat([_vm(n) | some n in numbers.range(1, 3)], [_not_ready(4)])
	vmis := [_old_vmi(n) | some n in numbers.range(1, 4)]
	p := _plan(_pool({"replicas": 4, "maxUnavailable": "25%"}), vms, vmis)
	p.restart == ["my-vm-4"]
}

test_pending_restarts_wait_in_opportunistic_and_unmanaged_modes if {
	vms := [_vm(n) | some n in numbers.range(1, 2)]
	vmis := [_old_vmi(n) | some n in numbers.range(1, 2)]
	every strategy in [{"opportunistic": {}}, {"unmanaged": {}}] {
		p := _plan(_pool({"replicas": 2, "maxUnavailable": 2, "updateStrategy": strategy}), vms, vmis)
		p.restart == []
	}
}

test_percent_max_unavailable_rounds_down_with_a_floor if {
	vms := [_outdated(n) | some n in numbers.range(1, 8)]
	p := _plan(_pool({"replicas": 8}), vms, _running(numbers.range(1, 8)))
	count(p.update) == 2 # 25% of 8
	q := _plan(_pool({"replicas": 2}), array.slice(vms, 0, 2), _running([1, 2]))
	count(q.update) == 1 # 25% of 2 is 0, the floor is 1
}

test_update_selection_follows_its_policy if {
	policy := {"proactive": {"selectionPolicy": {"orderedPolicies": [{"labelSelector": {"matchLabels": {"canary": "yes"}}}]}}}
	vms := [_outdated(1), _labelled(_outdated(2), {"canary": "yes"}), _outdated(3)]
	p := _plan(_pool({"updateStrategy": policy, "maxUnavailable": 1}), vms, _running([1, 2, 3]))
	_names(p.update) == ["my-vm-2"]
}

test_updates_are_capped_by_the_burst_limit if {
	vms := [object.union(_outdated(n), {"status": {"ready": false}}) | some n in numbers.range(1, 3)]
	doc := object.union(_input(_pool({}), vms, _running([1, 2, 3])), {"burstLimit": 2})
	p := _plan_of(doc)
	count(p.update) == 2
	p.requeueAfterSeconds == 0
}

# Autohealing -----------------------------------------------------------------------------------

_failing(n, failures) := object.union(_not_ready(n), {"status": {"startFailure": {"consecutiveFailCount": failures}}})

_healing := {"replicas": 2, "autohealing": {"startupFailureThreshold": 3}}

test_autohealing_reprovisions_at_the_threshold if {
	p := _plan(_pool(_healing), [_vm(1), _failing(2, 3)], _running([1]))
	p.reprovision == [{"name": "my-vm-2", "volumes": ["dv-2"]}]
	p.reprovisions == [{"name": "my-vm-2", "count": 1, "lastTime": _now}]
	p.create == []
	p.update == []

	below := _plan(_pool(_healing), [_vm(1), _failing(2, 2)], _running([1]))
	below.reprovision == []
}

test_autohealing_is_off_without_the_field if {
	p := _plan(_pool({"replicas": 2}), [_vm(1), _failing(2, 30)], _running([1]))
	p.reprovision == []
	p.reprovisions == []
}

test_autohealing_backs_off_exponentially if {
	# Re-provisioned twice, last at 00:09:30: the third waits 20 s, until 00:09:50.
	record := {"name": "my-vm-2", "count": 2, "lastTime": "2026-01-01T00:09:30Z"}
	healing := object.union(_pool(_healing), {"status": {"reprovisions": [record]}})
	waiting := _plan_of(object.union(_input(healing, [_vm(1), _failing(2, 3)], _running([1])), {"now": "2026-01-01T00:09:41Z"}))
	waiting.reprovision == []
	waiting.requeueAfterSeconds == 9
	waiting.reprovisions == [record]

	due := _plan_of(object.union(_input(healing, [_vm(1), _failing(2, 3)], _running([1])), {"now": "2026-01-01T00:09:50Z"}))
	_names(due.reprovision) == ["my-vm-2"]
	due.reprovisions == [{"name": "my-vm-2", "count": 3, "lastTime": "2026-01-01T00:09:50Z"}]
}

test_backoff_doubles_up_to_the_maximum if {
	[pool.backoff_seconds(1), pool.backoff_seconds(2), pool.backoff_seconds(3), pool.backoff_seconds(6), pool.backoff_seconds(60)] == [10, 20, 40, 300, 300]
}

test_reprovisioned_name_is_created_first_and_record_kept_until_ready if {
	record := {"name": "my-vm-2", "count": 1, "lastTime": "2026-01-01T00:09:00Z"}
	healing := object.union(_pool(object.union(_healing, {"replicas": 3})), {"status": {"reprovisions": [record]}})
	p := _plan(healing, [_vm(1), _vm(3)], _running([1, 3]))
	_names(p.create) == ["my-vm-2"]
	p.reprovisions == [record]

	ready := _plan(healing, [_vm(1), _vm(2), _vm(3)], _running([1, 2, 3]))
	ready.reprovisions == []
}

test_scale_in_wins_over_reprovisioning if {
	p := _shipped_plan(_pool({"replicas": 1, "autohealing": {}}), [_vm(1), _failing(2, 5)], _running([1]))
	_names(p.delete) == ["my-vm-2"]
	p.reprovision == []
}

# Status ----------------------------------------------------------------------------------------

test_status_counts_and_conditions if {
	p := _plan(_pool({}), [_vm(1), _not_ready(2), _outdated(3)], _running([1, 2, 3]))
	p.status == {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 2, "labelSelector": "pool.virt-rules.io/pool=my-vm"}
	_condition(p, "Scaled").status == "True"
	_condition(p, "Ready").status == "False"

	plan := _plan(_pool({}), [_vm(1), _vm(2), _vm(3)], _running([1, 2, 3]))
	[c.status | some c in plan.conditions] == ["True", "True", "True"]
	plan.create == []
	plan.requeueAfterSeconds == null
}

test_vm_whose_vmi_is_gone_or_not_ready_is_not_ready if {
	p := _plan(_pool({"replicas": 1}), [_vm(1)], [object.union(_vmi(1), {"status": {"phase": "Failed"}})])
	p.status.readyReplicas == 0
	q := _plan(_pool({"replicas": 1}), [_vm(1)], [object.union(_vmi(1), {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})])
	q.status.readyReplicas == 0
}

test_run_strategy_always_is_not_halted if {
	always := object.union(_vm(1), {"spec": {"running": null, "runStrategy": "Always"}, "status": {"ready": false}})
	p := _plan(_pool({"replicas": 0, "scaleInStrategy": {"opportunistic": {}}}), [always], [])
	p.delete == []
}
