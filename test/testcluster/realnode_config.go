package testcluster

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// containerdConfig is containerd 1.6's configuration for a real node: its own root, state and
// sockets under the node's folder, so that it shares nothing with a containerd the machine may
// run, and the CRI plugin kubelet talks to. Its one departure from a cluster's is the one
// setting without which no pod runs on a sandboxed CI machine, restrict_oom_score_adj: the CRI
// plugin gives every pod sandbox oomScoreAdj -998 (kubelet gives a Guaranteed pod's containers
// -997), and where even root may not lower a process's oom_score_adj (CAP_SYS_RESOURCE not
// honoured), runc's nsexec dies writing /proc/self/oom_score_adj, which runc reports as "can't
// get final child's PID from pipe: EOF". restrict_oom_score_adj, meant for rootless
// containerd, clamps every value to containerd's own score instead (docs/real-node.md).
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %[8]q
        SystemdCgroup = false
`

// kubeletConfig is kubelet's configuration for a real node beside others on one machine:
//
//   - failCgroupV1 false: kubelet 1.35 refuses cgroup v1 unless told, and CI machines still
//     run it;
//   - cgroupfs, cgroupsPerQOS false and no node allocatable enforcement: kubelet makes no
//     cgroup hierarchy of its own (containers go to containerd's /k8s.io/ID), nothing a
//     machine without systemd as PID 1 can refuse;
//   - failSwapOn false, for machines with swap;
//   - its own ports on the node's IP, so that two real nodes can coexist;
//   - only clients with a certificate of the cluster's CA (kube-apiserver, Options.RealNodes)
//     are let in, and all of them are allowed everything;
//   - no eviction on disk pressure and no image garbage collection: the images were imported,
//     nothing could pull them back.
type kubeletConfig struct {
	APIVersion                  string            `json:"apiVersion"`
	Kind                        string            `json:"kind"`
	FailCgroupV1                bool              `json:"failCgroupV1"`
	CgroupDriver                string            `json:"cgroupDriver"`
	CgroupsPerQOS               bool              `json:"cgroupsPerQOS"`
	EnforceNodeAllocatable      []string          `json:"enforceNodeAllocatable"`
	FailSwapOn                  bool              `json:"failSwapOn"`
	Address                     string            `json:"address"`
	Port                        int               `json:"port"`
	ReadOnlyPort                int               `json:"readOnlyPort"`
	HealthzBindAddress          string            `json:"healthzBindAddress"`
	HealthzPort                 int               `json:"healthzPort"`
	ContainerRuntimeEndpoint    string            `json:"containerRuntimeEndpoint"`
	Authentication              kubeletAuthn      `json:"authentication"`
	Authorization               map[string]string `json:"authorization"`
	PodCIDR                     string            `json:"podCIDR"`
	ResolvConf                  string            `json:"resolvConf"`
	EvictionHard                map[string]string `json:"evictionHard"`
	ImageGCHighThresholdPercent int               `json:"imageGCHighThresholdPercent"`
	ImageGCLowThresholdPercent  int               `json:"imageGCLowThresholdPercent"`
	SerializeImagePulls         bool              `json:"serializeImagePulls"`
}

type kubeletAuthn struct {
	Anonymous map[string]bool   `json:"anonymous"`
	Webhook   map[string]bool   `json:"webhook"`
	X509      map[string]string `json:"x509"`
}

// cniConfig is the node's pod network: a bridge of its own with host-local addresses from
// the node's pod CIDR, the bridge the pods' gateway, so that the API server on this machine
// reaches a pod (a webhook) at its IP.
type cniConfig struct {
	CNIVersion string      `json:"cniVersion"`
	Name       string      `json:"name"`
	Plugins    []cniPlugin `json:"plugins"`
}

type cniPlugin struct {
	Type        string          `json:"type"`
	Bridge      string          `json:"bridge,omitempty"`
	IsGateway   bool            `json:"isGateway,omitempty"`
	HairpinMode bool            `json:"hairpinMode,omitempty"`
	IPAM        map[string]any  `json:"ipam,omitempty"`
	Caps        map[string]bool `json:"capabilities,omitempty"`
}

// writeConfig writes containerd's, kubelet's and the CNI configuration into the node's folder.
func (n *RealNode) writeConfig(o RealNodeOptions) error {
	for _, d := range []string{"containerd/root", "containerd/state", "cni/net.d", "cni/ipam", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return fmt.Errorf("write configuration of %s: %w", n.Name, err)
		}
	}
	containerd := fmt.Sprintf(containerdConfig,
		filepath.Join(n.Dir, "containerd/root"), filepath.Join(n.Dir, "containerd/state"),
		n.socket, n.socket+".ttrpc", pauseImageRef, cniBinDir, filepath.Join(n.Dir, "cni/net.d"), runcBin)
	if err := os.WriteFile(filepath.Join(n.Dir, "containerd.toml"), []byte(containerd), 0o644); err != nil {
		return fmt.Errorf("write containerd configuration of %s: %w", n.Name, err)
	}
	port := cmp.Or(o.KubeletPort, 10350)
	podCIDR := cmp.Or(o.PodCIDR, "10.88.0.0/24")
	kubelet := kubeletConfig{
		APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration",
		CgroupDriver: "cgroupfs", EnforceNodeAllocatable: []string{},
		Address: n.IP.String(), Port: port, HealthzBindAddress: "127.0.0.1", HealthzPort: port + 1,
		ContainerRuntimeEndpoint: "unix://" + n.socket,
		Authentication: kubeletAuthn{
			Anonymous: map[string]bool{"enabled": false},
			Webhook:   map[string]bool{"enabled": false},
			X509:      map[string]string{"clientCAFile": n.cluster.ca.certFile},
		},
		Authorization: map[string]string{"mode": "AlwaysAllow"},
		PodCIDR:       podCIDR, ResolvConf: "/etc/resolv.conf",
		EvictionHard:                map[string]string{"memory.available": "100Mi", "nodefs.available": "0%", "imagefs.available": "0%"},
		ImageGCHighThresholdPercent: 100, ImageGCLowThresholdPercent: 99,
	}
	if err := writeJSON(filepath.Join(n.Dir, "kubelet.yaml"), kubelet); err != nil {
		return fmt.Errorf("write kubelet configuration of %s: %w", n.Name, err)
	}
	cni := cniConfig{CNIVersion: "1.0.0", Name: "virt-rules-" + n.Name, Plugins: []cniPlugin{
		{Type: "bridge", Bridge: n.bridge, IsGateway: true, HairpinMode: true, IPAM: map[string]any{
			"type":    "host-local",
			"ranges":  [][]map[string]string{{{"subnet": podCIDR}}},
			"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
			"dataDir": filepath.Join(n.Dir, "cni/ipam"),
		}},
		{Type: "portmap", Caps: map[string]bool{"portMappings": true}},
	}}
	if err := writeJSON(filepath.Join(n.Dir, "cni/net.d/10-bridge.conflist"), cni); err != nil {
		return fmt.Errorf("write CNI configuration of %s: %w", n.Name, err)
	}
	return nil
}

// writeJSON writes v as JSON (which is YAML, for kubelet).
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// bridgeName is the node's CNI bridge: "vr" and a hash of the node's name, within Linux's 15
// characters and the same for the same name, so that a bridge left by a killed run is found.
func bridgeName(node string) string {
	sum := sha256.Sum256([]byte(node))
	return "vr" + hex.EncodeToString(sum[:])[:10]
}
