package virtrules.pool_test

import data.virtrules.pool

# settings.semantics: kubevirt, KubeVirt v1.9.0's pool controller (pkg/virt-controller/watch/pool),
# against the design's answer for the same input.

_kv_plan(p, vms, vmis) := plan if {
	plan := pool.plan with input as _input(p, vms, vmis) with pool.settings.semantics as "kubevirt"
}

_kv_input_plan(doc) := plan if {
	plan := pool.plan with input as doc with pool.settings.semantics as "kubevirt"
}

# VM n with labels on its VMI template, as KubeVirt's selectors read them.
_vmi_labelled(vm, labels) := object.union(vm, {"spec": {"template": {"metadata": {"labels": labels}}}})

test_kubevirt_names_start_at_zero if {
	p := _kv_plan(_pool({"replicas": 3}), [], [])
	_names(p.create) == ["my-vm-0", "my-vm-1", "my-vm-2"]
	p.create[0].vm.spec.dataVolumeTemplates[0].metadata.name == "dv-0"
}

test_kubevirt_names_fill_gaps_from_zero if {
	# As upstream's "should fill in name gaps": 1 and 3 exist, three more are 0, 2, 4.
	p := _kv_plan(_pool({"replicas": 5}), [_vm(1), _vm(3)], _running([1, 3]))
	_names(p.create) == ["my-vm-0", "my-vm-2", "my-vm-4"]
	q := _plan(_pool({"replicas": 5}), [_vm(1), _vm(3)], _running([1, 3]))
	_names(q.create) == ["my-vm-2", "my-vm-4", "my-vm-5"]
}

test_kubevirt_vm_zero_is_the_pools_own if {
	zero := object.union(_outdated(1), {"metadata": {"name": "my-vm-0"}})
	p := _kv_plan(_pool({"replicas": 1, "maxUnavailable": 1}), [zero], [object.union(_vmi(1), {"metadata": {"name": "my-vm-0"}})])
	_names(p.update) == ["my-vm-0"]
	p.update[0].vm.metadata.name == "my-vm-0"

	# The design numbers from 1: my-vm-0 is an owned VM it never updates.
	q := _plan(_pool({"replicas": 1, "maxUnavailable": 1}), [zero], [])
	q.update == []
}

test_kubevirt_max_unavailable_defaults_to_all if {
	vms := [_vm(n) | some n in numbers.range(1, 4)]
	vmis := [_old_vmi(n) | some n in numbers.range(1, 4)]
	p := _kv_plan(_pool({"replicas": 4}), vms, vmis)
	p.restart == ["my-vm-1", "my-vm-2", "my-vm-3", "my-vm-4"]
	q := _plan(_pool({"replicas": 4}), vms, vmis)
	count(q.restart) == 1 # the design's 25%
}

test_kubevirt_max_unavailable_integer_has_the_floor if {
	vms := [_vm(n) | some n in numbers.range(1, 2)]
	vmis := [_old_vmi(n) | some n in numbers.range(1, 2)]
	p := _kv_plan(_pool({"replicas": 2, "maxUnavailable": 0}), vms, vmis)
	count(p.restart) == 1
	q := _plan(_pool({"replicas": 2, "maxUnavailable": 0}), vms, vmis)
	q.restart == []
}

test_kubevirt_pending_restarts_respect_the_budget_too if {
	vms := [_vm(n) | some n in numbers.range(1, 4)]
	vmis := [_old_vmi(n) | some n in numbers.range(1, 4)]
	p := _kv_plan(_pool({"replicas": 4, "maxUnavailable": "25%"}), vms, vmis)
	count(p.restart) == 1
	flapping := object.union(_old_vmi(4), {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
	q := _kv_plan(_pool({"replicas": 4, "maxUnavailable": "25%"}), vms, array.concat([_old_vmi(n) | some n in numbers.range(1, 3)], [flapping]))
	q.restart == []
}

_canary := {"orderedPolicies": [{"labelSelector": {"matchLabels": {"app": "test"}}}]}

test_kubevirt_update_selectors_filter if {
	# As upstream's label selector update test: five updated VMs on old VMIs, two labelled.
	vms := array.concat(
		[_vmi_labelled(_vm(n), {"app": "test"}) | some n in numbers.range(1, 2)],
		[_vm(n) | some n in numbers.range(3, 5)],
	)
	vmis := [_old_vmi(n) | some n in numbers.range(1, 5)]
	spec := {"replicas": 5, "maxUnavailable": "100%", "updateStrategy": {"proactive": {"selectionPolicy": _canary}}}
	p := _kv_plan(_pool(spec), vms, vmis)
	p.restart == ["my-vm-1", "my-vm-2"]

	# The design orders: the labelled first, then the rest (and matches VM labels).
	q := _plan(_pool(spec), vms, vmis)
	q.restart == ["my-vm-1", "my-vm-2", "my-vm-3", "my-vm-4", "my-vm-5"]

	# Outdated VMs outside the selectors are not updated either.
	r := _kv_plan(_pool(spec), [_outdated(1), _vmi_labelled(_outdated(2), {"app": "test"})], _running([1, 2]))
	_names(r.update) == ["my-vm-2"]
}

test_kubevirt_scale_in_selectors_filter if {
	vms := array.concat([_vm(n) | some n in numbers.range(1, 3)], [_vmi_labelled(_vm(n), {"app": "test"}) | some n in numbers.range(4, 5)])
	spec := {"replicas": 2, "scaleInStrategy": {"proactive": {"selectionPolicy": object.union(_canary, {"basePolicy": "Oldest"})}}}
	p := _kv_plan(_pool(spec), vms, _running(numbers.range(1, 5)))
	_names(p.delete) == ["my-vm-4", "my-vm-5"]

	# The design deletes all three it must, the matching first (by VM labels: none here).
	q := _plan(_pool(spec), vms, _running(numbers.range(1, 5)))
	_names(q.delete) == ["my-vm-1", "my-vm-2", "my-vm-3"]
}

test_kubevirt_selection_without_selectors_is_the_base_policy if {
	spec := {"replicas": 1, "scaleInStrategy": {"proactive": {"selectionPolicy": {"basePolicy": "Newest"}}}}
	p := _kv_plan(_pool(spec), [_vm(1), _vm(2)], _running([1, 2]))
	_names(p.delete) == ["my-vm-2"]
}

# A VM stuck in status for the given seconds before _now (00:10:00).
_stuck(n, status, seconds) := object.union(_not_ready(n), {"status": {
	"printableStatus": status,
	"conditions": [{"type": "Ready", "status": "False", "lastProbeTime": time.format([time.parse_rfc3339_ns(_now) - (seconds * 1000000000), "UTC", "2006-01-02T15:04:05Z07:00"])}],
}})

test_kubevirt_autohealing_reprovisions_vms_failing_to_start if {
	every status in ["CrashLoopBackOff", "ErrorUnschedulable", "ErrImagePull", "ImagePullBackOff", "DataVolumeError", "ErrorPvcNotFound"] {
		p := _kv_plan(_pool({"replicas": 2, "autohealing": {}}), [_vm(1), _stuck(2, status, 360)], _running([1]))
		_names(p.reprovision) == ["my-vm-2"]
		q := _plan(_pool({"replicas": 2, "autohealing": {}}), [_vm(1), _stuck(2, status, 360)], _running([1]))
		q.reprovision == []
	}
}

test_kubevirt_autohealing_waits_min_failing_to_start_duration if {
	early := _kv_plan(_pool({"replicas": 2, "autohealing": {}}), [_vm(1), _stuck(2, "CrashLoopBackOff", 299)], _running([1]))
	early.reprovision == []
	longer := _kv_plan(_pool({"replicas": 2, "autohealing": {"minFailingToStartDuration": "10m"}}), [_vm(1), _stuck(2, "CrashLoopBackOff", 360)], _running([1]))
	longer.reprovision == []
	shorter := _kv_plan(_pool({"replicas": 2, "autohealing": {"minFailingToStartDuration": "1m"}}), [_vm(1), _stuck(2, "CrashLoopBackOff", 60)], _running([1]))
	_names(shorter.reprovision) == ["my-vm-2"]
}

test_kubevirt_autohealing_needs_the_field_and_a_failing_status if {
	off := _kv_plan(_pool({"replicas": 2}), [_vm(1), _stuck(2, "CrashLoopBackOff", 3600)], _running([1]))
	off.reprovision == []
	stopped := _kv_plan(_pool({"replicas": 2, "autohealing": {}}), [_vm(1), _stuck(2, "Stopped", 3600)], _running([1]))
	stopped.reprovision == []

	# The start failure count still counts.
	counted := _kv_plan(_pool({"replicas": 2, "autohealing": {}}), [_vm(1), _failing(2, 3)], _running([1]))
	_names(counted.reprovision) == ["my-vm-2"]
}

test_semantics_setting_is_checked if {
	pool.settings_errors == {`settings.semantics: newest must be "default" or "kubevirt"`} with pool.settings.semantics as "newest"
	count(pool.settings_errors) == 0 with pool.settings.semantics as "kubevirt"
}

test_min_failing_to_start_duration_is_validated if {
	_errors({"autohealing": {"minFailingToStartDuration": "soon"}}) == ["spec.autohealing.minFailingToStartDuration: soon must be a duration such as 5m"]
	_errors({"autohealing": {"minFailingToStartDuration": "-1m"}}) == ["spec.autohealing.minFailingToStartDuration: -1m must be a duration such as 5m"]
	not pool.plan.errors with input as _input(_pool({"autohealing": {"minFailingToStartDuration": "90s"}}), [], [])
}

# The hash a VMI running the current template carries with KubeVirt's semantics, as the plan
# renders it: that of the VMI template alone.
_kv_vmi_hash := h if {
	p := _kv_plan(_pool({"replicas": 1}), [], [])
	h := p.create[0].vm.spec.template.metadata.annotations["pool.virt-rules.io/template-hash"]
}

_kv_vmi(n) := object.union(_vmi(n), {"metadata": {"annotations": {"pool.virt-rules.io/template-hash": _kv_vmi_hash}}})

_ascending := {"proactive": {"selectionPolicy": {"basePolicy": "AscendingOrder"}}}

test_kubevirt_vmi_template_hash_is_the_vmi_templates_own if {
	p := _kv_plan(_pool({"replicas": 1}), [], [])
	vm := p.create[0].vm
	vm.spec.template.metadata.annotations["pool.virt-rules.io/template-hash"] != vm.metadata.annotations["pool.virt-rules.io/template-hash"]

	# The design stamps the whole template's hash on both.
	q := _plan(_pool({"replicas": 1}), [], [])
	q.create[0].vm.spec.template.metadata.annotations["pool.virt-rules.io/template-hash"] == _hash
}

test_kubevirt_updates_every_outdated_vm_at_once_and_restarts_within_the_budget if {
	vms := [_outdated(n) | some n in numbers.range(1, 4)]
	vmis := [_old_vmi(n) | some n in numbers.range(1, 4)]
	spec := {"replicas": 4, "maxUnavailable": 1, "updateStrategy": _ascending}
	p := _kv_plan(_pool(spec), vms, vmis)
	_names(p.update) == ["my-vm-1", "my-vm-2", "my-vm-3", "my-vm-4"]
	p.restart == ["my-vm-1"]

	# The design updates only what it restarts.
	q := _plan(_pool(spec), vms, vmis)
	_names(q.update) == ["my-vm-1"]
	q.restart == ["my-vm-1"]
}

test_kubevirt_opportunistic_updates_running_vms_and_restarts_none if {
	vms := [_outdated(n) | some n in numbers.range(1, 3)]
	spec := {"replicas": 3, "updateStrategy": {"opportunistic": {}}}
	p := _kv_plan(_pool(spec), vms, [_old_vmi(n) | some n in numbers.range(1, 3)])
	sort(_names(p.update)) == ["my-vm-1", "my-vm-2", "my-vm-3"]
	p.restart == []

	# The design updates halted VMs only.
	q := _plan(_pool(spec), vms, [_old_vmi(n) | some n in numbers.range(1, 3)])
	q.update == []
}

test_kubevirt_a_change_of_the_vm_alone_restarts_no_vmi if {
	# The VMs are outdated, their VMIs run the current VMI template.
	vms := [_outdated(n) | some n in numbers.range(1, 3)]
	p := _kv_plan(_pool({"replicas": 3}), vms, [_kv_vmi(n) | some n in numbers.range(1, 3)])
	count(p.update) == 3
	p.restart == []

	# Their VMIs from another VMI template are restarted (maxUnavailable 100%).
	r := _kv_plan(_pool({"replicas": 3}), vms, [_old_vmi(n) | some n in numbers.range(1, 3)])
	r.restart == ["my-vm-1", "my-vm-2", "my-vm-3"]

	# The design restarts VMIs on any change of the template.
	q := _plan(_pool({"replicas": 3, "maxUnavailable": "100%"}), vms, [_kv_vmi(n) | some n in numbers.range(1, 3)])
	count(q.restart) == 3
}

test_kubevirt_restarts_vms_update_selectors_match_once_updated if {
	canary := {"proactive": {"selectionPolicy": {"orderedPolicies": [{"labelSelector": {"matchLabels": {"canary": "true"}}}]}}}
	vms := [_vmi_labelled(_outdated(1), {"canary": "true"}), _outdated(2)]
	vmis := [_old_vmi(1), _old_vmi(2)]

	# The update gives my-vm-1 the template's VMI labels, without canary: KubeVirt then
	# restarts nothing.
	p := _kv_plan(_pool({"replicas": 2, "updateStrategy": canary}), vms, vmis)
	_names(p.update) == ["my-vm-1"]
	p.restart == []

	# A template that has the label keeps my-vm-1 selected.
	labelled := json.patch(_template, [{"op": "add", "path": "/spec/template/metadata", "value": {"labels": {"canary": "true"}}}])
	q := _kv_plan(_pool({"replicas": 2, "updateStrategy": canary, "template": labelled}), vms, vmis)
	_names(q.update) == ["my-vm-1"]
	q.restart == ["my-vm-1"]
}

test_kubevirt_unavailable_vms_outside_the_update_selectors_take_no_budget if {
	canary := {"proactive": {"selectionPolicy": {
		"basePolicy": "AscendingOrder",
		"orderedPolicies": [{"labelSelector": {"matchLabels": {"canary": "true"}}}],
	}}}
	vms := [_vmi_labelled(_vm(1), {"canary": "true"}), _vmi_labelled(_vm(2), {"canary": "true"}), _not_ready(3)]
	vmis := [_old_vmi(1), _old_vmi(2), _kv_vmi(3)]
	spec := {"replicas": 3, "maxUnavailable": 1, "updateStrategy": canary}
	p := _kv_plan(_pool(spec), vms, vmis)
	p.restart == ["my-vm-1"]

	# my-vm-3 selected too: its unavailability uses the budget.
	q := _kv_plan(_pool(spec), array.concat(array.slice(vms, 0, 2), [_vmi_labelled(_not_ready(3), {"canary": "true"})]), vmis)
	q.restart == []
}

test_kubevirt_vms_being_deleted_count_until_gone if {
	going := object.union(_vm(3), {"metadata": {"deletionTimestamp": _now}})
	p := _kv_plan(_pool({"replicas": 3}), [_vm(1), _vm(2), going], _running([1, 2, 3]))
	p.create == []

	# The design replaces it at once, under another name.
	q := _plan(_pool({"replicas": 3}), [_vm(1), _vm(2), going], _running([1, 2, 3]))
	_names(q.create) == ["my-vm-4"]
}

test_kubevirt_opportunistic_scale_in_deletes_nothing if {
	spec := {"replicas": 2, "scaleInStrategy": {"opportunistic": {}}}
	p := _kv_plan(_pool(spec), [_vm(1), _stopped(2), _vm(3)], _running([1, 3]))
	p.delete == []
	_condition(p, "Scaled").reason == "ScaleInBlocked"

	# The design deletes the halted VM.
	q := _plan(_pool(spec), [_vm(1), _stopped(2), _vm(3)], _running([1, 3]))
	_names(q.delete) == ["my-vm-2"]
}

# The input's semantics wins over the settings': eval previews KubeVirt's own pools with it.
test_input_semantics_overrides_the_settings if {
	doc := object.union(_input(_pool({"replicas": 2}), [], []), {"semantics": "kubevirt"})
	previewed := pool.plan with input as doc with pool.settings.semantics as "default"
	_names(previewed.create) == ["my-vm-0", "my-vm-1"]

	designed := pool.plan with input as object.union(doc, {"semantics": "default"}) with pool.settings.semantics as "kubevirt"
	_names(designed.create) == ["my-vm-1", "my-vm-2"]
}

test_input_semantics_is_checked if {
	doc := object.union(_input(_pool({"replicas": 1}), [], []), {"semantics": "newest"})
	plan := pool.plan with input as doc
	plan.errors == [`semantics: newest must be "default" or "kubevirt"`]
}
