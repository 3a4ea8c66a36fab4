# VirtualMachinePool VMs from the template.
#
# The VirtualMachine the pool wants as its number n: the template's metadata and spec, the
# pool's label, the template hash, a controller ownerReference to the pool, and the names
# made unique per VM: DataVolumeTemplates get "-<n>" (and the volumes using them follow);
# with spec.nameGeneration, Secret and ConfigMap references in volumes too.
package virtrules.pool

_dv_reference_paths := [["dataVolume", "name"], ["persistentVolumeClaim", "claimName"]]

_secret_reference_paths := [
	["secret", "secretName"],
	["cloudInitNoCloud", "secretRef", "name"],
	["cloudInitNoCloud", "networkDataSecretRef", "name"],
	["cloudInitConfigDrive", "secretRef", "name"],
	["cloudInitConfigDrive", "networkDataSecretRef", "name"],
	["sysprep", "secret", "name"],
]

_configmap_reference_paths := [["configMap", "name"], ["sysprep", "configMap", "name"]]

_template_spec := object.get(_template, "spec", {})

_data_volume_templates := object.get(_template_spec, "dataVolumeTemplates", [])

_data_volume_template_names := {d.metadata.name | some d in _data_volume_templates}

_name_generation(flag) if object.get(_spec, ["nameGeneration", flag], false) == true

_renamed_paths(volume) := ({path |
	some path in _dv_reference_paths
	object.get(volume, path, null) in _data_volume_template_names
} | {path |
	_name_generation("appendPostfixToSecretReferences")
	some path in _secret_reference_paths
	is_string(object.get(volume, path, null))
}) | {path |
	_name_generation("appendPostfixToConfigMapReferences")
	some path in _configmap_reference_paths
	is_string(object.get(volume, path, null))
}

_postfixed(volume, postfix) := json.patch(volume, [{
	"op": "replace",
	"path": concat("/", array.concat([""], path)),
	"value": concat("", [object.get(volume, path, ""), postfix]),
} |
	some path in _renamed_paths(volume)
])

# obj with key set to value, only when obj has key.
_replace(obj, key, value) := object.union(obj, {key: value}) if key in object.keys(obj)

_replace(obj, key, _) := obj if not key in object.keys(obj)

_vm_spec(postfix) := object.union(
	_replace(_template_spec, "dataVolumeTemplates", [
	object.union(d, {"metadata": {"name": concat("", [d.metadata.name, postfix])}}) |
		some d in _data_volume_templates
	]),
	{"template": {
		"metadata": object.union(_vmi_metadata, {"annotations": object.union(
			object.get(_vmi_metadata, "annotations", {}),
			{annotation_template_hash: _vmi_template_hash},
		)}),
		"spec": _replace(_vmi_spec, "volumes", [_postfixed(v, postfix) | some v in object.get(_vmi_spec, "volumes", [])]),
	}},
)

_vmi_template := object.get(_template_spec, "template", {})

_vmi_metadata := object.get(_vmi_template, "metadata", {})

_vmi_spec := object.get(_vmi_template, "spec", {})

_template_metadata := object.get(_template, "metadata", {})

# METADATA
# description: The VirtualMachine number n of the pool, as the controller creates or updates it.
vm(n) := {
	"apiVersion": "kubevirt.io/v1",
	"kind": "VirtualMachine",
	"metadata": {
		"name": vm_name(n),
		"namespace": _namespace,
		"labels": object.union(object.get(_template_metadata, "labels", {}), {label_pool: _name}),
		"annotations": object.union(
			object.get(_template_metadata, "annotations", {}),
			{annotation_template_hash: template_hash},
		),
		"ownerReferences": [{
			"apiVersion": "pool.virt-rules.io/v1alpha1",
			"kind": "VirtualMachinePool",
			"name": _name,
			"uid": _uid,
			"controller": true,
			"blockOwnerDeletion": true,
		}],
	},
	"spec": _vm_spec(sprintf("-%d", [n])),
}
