//go:build virtrules_oracle

// This file is virt-rules' own, not KubeVirt's. hack/kubevirt.sh copies every file under
// hack/kubevirt/export/ into the package of the same path in its throwaway copy of the
// kubevirt.io/kubevirt module, just before it builds kubevirt-oracle there, so that the oracle
// can call what KubeVirt does not export. Nothing else is built with it: the build tag keeps
// it out of virt-rules' module and of KubeVirt's own binaries.
package migration

import (
	k8sv1 "k8s.io/api/core/v1"

	virtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/api/migrations/v1alpha1"
)

// MatchPolicy is virt-controller's matchPolicy: the MigrationPolicy of policies its migration
// controller applies to vmi, in namespace, when it starts migrating it; nil when none matches.
func MatchPolicy(policies *v1alpha1.MigrationPolicyList, vmi *virtv1.VirtualMachineInstance, namespace *k8sv1.Namespace) *v1alpha1.MigrationPolicy {
	return matchPolicy(policies, vmi, namespace)
}
