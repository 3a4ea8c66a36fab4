package testcluster

import "testing"

// A kwok node carries every label a kubelet registers its node with, so that
// kube-controller-manager has none to add (at 5,000 nodes, 5,000 PATCHes), and the labels
// asked for win over the defaults.
func TestNodeCarriesAKubeletsLabels(t *testing.T) {
	n := Node("node-1", Skylake, map[string]string{"kubevirt.io/schedulable": "false", "zone": "a"})
	want := map[string]string{
		"kubernetes.io/hostname":  "node-1",
		"kubernetes.io/arch":      "amd64",
		"beta.kubernetes.io/arch": "amd64",
		"beta.kubernetes.io/os":   "linux",
		"kubernetes.io/os":        "linux",
		"kubevirt.io/schedulable": "false",
		"zone":                    "a",
		"host-model-cpu.node.kubevirt.io/" + Skylake.HostModel: "true",
	}
	for k, v := range want {
		if got, ok := n.Labels[k]; !ok || got != v {
			t.Errorf("label %s: got %q (present %v), want %q", k, got, ok, v)
		}
	}
}
