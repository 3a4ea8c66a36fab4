# The admin's own tests for the pool change, run by `make custom-bundle` (opa test) next to the
# shipped ones: scale-in under the Random base policy takes ready VMs first and keeps stopped
# and not-ready ones (for investigation) until the ready ones are gone.
package virtrules.pool_custom_test

import data.virtrules.pool

test_random_prefers_ready_vms if {
	data.virtrules.pool.settings.random.prefer == ["ready"]
	count(pool.settings_errors) == 0
}

_owner := {"apiVersion": "pool.virt-rules.io/v1alpha1", "kind": "VirtualMachinePool", "name": "web", "uid": "pool-uid", "controller": true}

_vm(name, running, ready) := {
	"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z", "ownerReferences": [_owner]},
	"spec": {"running": running},
	"status": {"ready": ready},
}

_vmi(name) := {
	"metadata": {"name": name},
	"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}

test_scale_in_keeps_stopped_and_not_ready_vms if {
	plan := pool.plan with input as {
		"pool": {
			"apiVersion": "pool.virt-rules.io/v1alpha1", "kind": "VirtualMachinePool",
			"metadata": {"name": "web", "namespace": "ns", "uid": "pool-uid"},
			"spec": {"replicas": 2, "template": {"spec": {"running": true}}},
		},
		"vms": [_vm("web-1", true, true), _vm("web-2", false, false), _vm("web-3", true, false)],
		"vmis": [_vmi("web-1")],
		"now": "2026-01-01T00:10:00Z",
	}
	[d.name | some d in plan.delete] == ["web-1"]
}
