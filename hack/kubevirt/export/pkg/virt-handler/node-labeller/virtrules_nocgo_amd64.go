//go:build virtrules_oracle && !cgo

// This file is virt-rules' own, not KubeVirt's, copied into KubeVirt's package as virtrules.go
// beside it is (see there). hack/kubevirt.sh builds kubevirt-oracle with CGO_ENABLED=0, and on
// amd64 KubeVirt's getCapLabels is in a cgo file (kvm-caps-info-plugin_amd64.go: /dev/kvm
// ioctls) that such a build leaves out: without this file, the package (node_labeller.go's
// loadHypervFeatures calls getCapLabels) would not compile.
package nodelabeller

// getCapLabels stands in for KubeVirt's amd64 one with what that one returns when /dev/kvm
// cannot be opened, and what KubeVirt's arm64 one always returns: no Hyper-V capability. The
// node labeller's hyperv.node.kubevirt.io/ labels are then never set, whatever the machine.
func getCapLabels() []string {
	return nil
}
