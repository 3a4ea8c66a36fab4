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

_data_volume_template_names contains d.metadata.name if some d in _data_volume_templates

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

_vmi_volumes := object.get(_vmi_spec, "volumes", [])

# The renames of each of the VMI template's volumes, computed once per plan: [the JSON pointer
# of each field renamed, its value before the postfix].
_volume_renames := [[[concat("/", array.concat([""], path)), object.get(volume, path, "")] |
	some path in _renamed_paths(volume)
] |
	some volume in _vmi_volumes
]

# The VM spec the template gives every VM, before the per-VM names: the VMI template's metadata
# with the template hash. Computed once per plan; each VM adds only its own names.
_vm_spec_base := object.union(_template_spec, {"template": {
	"metadata": object.union(_vmi_metadata, {"annotations": object.union(
		object.get(_vmi_metadata, "annotations", {}),
		{annotation_template_hash: _vmi_template_hash},
	)}),
	"spec": _vmi_spec,
}})

# The fields of the spec that carry per-VM names, those the template has: its
# DataVolumeTemplates, and its VMI template's volumes.
_named_fields := {"dataVolumeTemplates" | _ = _template_spec.dataVolumeTemplates} | {"template" | _ = _vmi_spec.volumes}

# The parts of the spec and of its VMI template that are the same for every VM: all but the
# fields carrying per-VM names. Computed once per plan; each VM's spec joins them with its own
# names, keys apart, so that no VM copies more than the few keys at each level.
_vm_spec_shared := object.remove(_vm_spec_base, _named_fields)

_vmi_template_shared := object.remove(_vm_spec_base.template, ["spec"])

_vmi_spec_shared := object.remove(_vmi_spec, ["volumes"])

_vmi_template := object.get(_template_spec, "template", {})

_vmi_metadata := object.get(_vmi_template, "metadata", {})

_vmi_spec := object.get(_vmi_template, "spec", {})

_template_metadata := object.get(_template, "metadata", {})

# The metadata every VM of the pool gets: the template's labels and annotations, the pool's
# label, the template hash, and a controller ownerReference to the pool.
_vm_labels := object.union(object.get(_template_metadata, "labels", {}), {label_pool: _name})

_vm_annotations := object.union(
	object.get(_template_metadata, "annotations", {}),
	{annotation_template_hash: template_hash},
)

_vm_owner_references := [{
	"apiVersion": "pool.virt-rules.io/v1alpha1",
	"kind": "VirtualMachinePool",
	"name": _name,
	"uid": _uid,
	"controller": true,
	"blockOwnerDeletion": true,
}]

# METADATA
# description: The VirtualMachine number n of the pool, as the controller creates or updates it.
vm(n) := _render([n])[0]

# The VirtualMachines of the numbers ordinals, in their order. The values every VM shares are bound once,
# before the loop (a rule named inside it would be an evaluation per VM); each VM adds its own
# name, and its spec the fields carrying per-VM names: DataVolumeTemplates postfixed, and the
# volumes' references to them (and to Secrets and ConfigMaps, with nameGeneration) with them.
_render(ordinals) := [{
	"apiVersion": "kubevirt.io/v1",
	"kind": "VirtualMachine",
	"metadata": {
		"name": concat("", [name, postfix]),
		"namespace": namespace,
		"labels": labels,
		"annotations": annotations,
		"ownerReferences": owner_references,
	},
	"spec": object.union(spec_shared, object.filter(
		{
			"dataVolumeTemplates": [object.union(d, {"metadata": {"name": concat("", [d.metadata.name, postfix])}}) |
				some d in dv_templates
			],
			"template": object.union(vmi_template_shared, {"spec": object.union(vmi_spec_shared, {"volumes": [json.patch(volume, [{"op": "replace", "path": path, "value": concat("", [value, postfix])} |
				some [path, value] in volume_renames
			]) |
				some i, volume in vmi_volumes
				volume_renames := renames[i]
			]})}),
		},
		named_fields,
	)),
} |
	[name, namespace, labels, annotations, owner_references] := [_name, _namespace, _vm_labels, _vm_annotations, _vm_owner_references]
	[spec_shared, vmi_template_shared, vmi_spec_shared] := [_vm_spec_shared, _vmi_template_shared, _vmi_spec_shared]
	[dv_templates, vmi_volumes, renames, named_fields] := [_data_volume_templates, _vmi_volumes, _volume_renames, _named_fields]
	some n in ordinals
	postfix := sprintf("-%d", [n])
]
