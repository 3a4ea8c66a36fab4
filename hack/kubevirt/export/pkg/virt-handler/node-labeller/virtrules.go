//go:build virtrules_oracle

// This file is virt-rules' own, not KubeVirt's. hack/kubevirt.sh copies every file under
// hack/kubevirt/export/ into the package of the same path in its throwaway copy of the
// kubevirt.io/kubevirt module, just before it builds kubevirt-oracle there, so that the oracle
// can call what KubeVirt does not export. Nothing else is built with it: the build tag keeps
// it out of virt-rules' module and of KubeVirt's own binaries.
package nodelabeller

import (
	k8sv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/log"

	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
)

// VirtRulesLabels is the set of labels virt-handler's node labeller gives an amd64 Node whose
// virt-launcher node-labeller.sh wrote dir (virsh_domcapabilities.xml and
// supported_features.xml, read as from /var/lib/kubevirt-node-labeller/): KubeVirt's own
// loadAll and prepareLabels, in a NodeLabeller built as newNodeLabeller builds it but reading
// dir, with no Node client, store, host name, queue, TSC counter or machine types, and a
// recorder that drops the event prepareLabels sends for an obsolete host model. The KubeVirt
// CR's obsoleteCPUModels (through clusterConfig) filter the cpu-model and cpu-model-migration
// labels and set the obsolete-host-model one, as on a node.
//
// The answer depends on dir and clusterConfig alone. What prepareLabels takes from elsewhere:
//   - hyperv.node.kubevirt.io/...: KubeVirt asks /dev/kvm with ioctls, in cgo
//     (kvm-caps-info-plugin_amd64.go). kubevirt-oracle is built with CGO_ENABLED=0, which
//     leaves that file out; virtrules_nocgo_amd64.go, beside this one in hack/kubevirt/export/,
//     stands in with KubeVirt's answer when /dev/kvm cannot be opened (and on arm64): none. No
//     hyperv label, ever.
//   - kubevirt.io/realtime: prepareLabels runs `sysctl kernel.sched_rt_runtime_us` on the
//     machine the oracle runs on (/proc/sys); VirtRulesLabels deletes that label, the only one
//     it deletes.
//   - cpu-timer.node.kubevirt.io/tsc-frequency and tsc-scalable: from the TSC counter of
//     `virsh capabilities` virt-handler passes in; none given, never set.
//   - machine-type.node.kubevirt.io/...: from the guest machines of `virsh capabilities`;
//     none given, never set.
//
// The architecture is amd64 whatever the oracle's own (newNodeLabeller takes runtime.GOARCH):
// the test cluster's nodes are amd64. A file that cannot be read or parsed is loadAll's error.
//
// The NodeLabeller fields and the loadAll and prepareLabels it calls are the same in KubeVirt
// v1.7.0 (whose NodeLabeller has no nodeStore and whose newNodeLabeller takes none, neither
// used here).
func VirtRulesLabels(clusterConfig *virtconfig.ClusterConfig, dir string) (map[string]string, error) {
	n := &NodeLabeller{
		recorder:                &record.FakeRecorder{}, // no channel: events are dropped
		logger:                  log.DefaultLogger(),
		clusterConfig:           clusterConfig,
		volumePath:              dir,
		domCapabilitiesFileName: "virsh_domcapabilities.xml",
		hostCPUModel:            hostCPUModel{requiredFeatures: make(map[string]bool)},
		arch:                    newArchLabeller(amd64),
	}
	if err := n.loadAll(); err != nil {
		return nil, err
	}
	labels := n.prepareLabels(&k8sv1.Node{})
	delete(labels, kubevirtv1.RealtimeLabel)
	return labels, nil
}
