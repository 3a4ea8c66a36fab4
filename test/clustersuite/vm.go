package clustersuite

import "strings"

// ContainerDiskImage is the container disk every test VM boots from.
const ContainerDiskImage = "quay.io/containerdisks/fedora:42"

// VMI is the template of a VMI that boots ContainerDiskImage as a virtio disk, the one VM,
// pool and VMI set-up the suites share. Its lines are YAML, written at their block's column
// (the indentation YAML adds), and may hold fmt verbs the caller fills in later.
type VMI struct {
	// Metadata are the lines of the template's metadata (labels: {app: %s}); none, no metadata.
	Metadata []string
	// Spec are lines of its spec besides domain and volumes (tolerations: […]).
	Spec []string
	// Domain are lines of spec.domain besides devices and resources (cpu: {model: …}).
	Domain []string
	// Devices are lines of spec.domain.devices besides disks (interfaces: […]).
	Devices []string
	// Requests is spec.domain.resources.requests, a YAML flow mapping: {cpu: '1', memory: 1Gi}.
	Requests string
}

// YAML is the template as the lines of a YAML mapping (metadata and spec) at column indent.
func (v VMI) YAML(indent int) string {
	var b strings.Builder
	line := func(depth int, s string) {
		b.WriteString(strings.Repeat(" ", indent+2*depth) + s + "\n")
	}
	lines := func(depth int, ls []string) {
		for _, l := range ls {
			line(depth, l)
		}
	}
	if len(v.Metadata) > 0 {
		line(0, "metadata:")
		lines(1, v.Metadata)
	}
	line(0, "spec:")
	lines(1, v.Spec)
	line(1, "domain:")
	lines(2, v.Domain)
	line(2, "devices:")
	line(3, "disks: [{name: containerdisk, disk: {bus: virtio}}]")
	lines(3, v.Devices)
	line(2, "resources: {requests: "+v.Requests+"}")
	line(1, "volumes:")
	line(1, "- name: containerdisk")
	line(1, "  containerDisk: {image: "+ContainerDiskImage+"}")
	return b.String()
}

// VMYAML is a VirtualMachine named by the first fmt verb that runs at once (runStrategy
// Always), whose VMI is v: the VM a user creates.
func VMYAML(v VMI) string {
	return `apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: %s}
spec:
  runStrategy: Always
  template:
` + v.YAML(4)
}
