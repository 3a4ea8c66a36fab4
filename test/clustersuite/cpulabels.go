//go:build libvirt

package clustersuite

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/virt-rules/virt-rules/internal/cpumap"
)

// CPUHost is a host of a node set: a node name and its CPU, a libvirt CPU model with features
// added or removed (microcode, BIOS settings).
type CPUHost struct {
	Name string
	CPU  cpumap.CPU
}

// Host is the x86_64 host name of vendor running model, each tweak "+feature" (has it beyond
// the model) or "-feature" (lacks it).
func Host(name, vendor, model string, tweak ...string) CPUHost {
	h := CPUHost{Name: name, CPU: cpumap.CPU{Arch: "x86_64", Model: model, Vendor: vendor}}
	for _, t := range tweak {
		if f, ok := strings.CutPrefix(t, "-"); ok {
			h.CPU.Disable = append(h.CPU.Disable, f)
		} else {
			h.CPU.Require = append(h.CPU.Require, strings.TrimPrefix(t, "+"))
		}
	}
	return h
}

// LabellerLabels are the labels KubeVirt's own node labeller (kubevirt-oracle node-labels, of
// the KubeVirt CR in the file kubevirtCR) writes on each host's node, from the files
// virt-handler's node-labeller.sh has libvirt write (see labellerFiles), in hosts' order.
func LabellerLabels(ctx context.Context, lib *cpumap.Libvirt, oracle, kubevirtCR string, hosts []CPUHost) []map[string]string {
	GinkgoHelper()
	models, err := lib.ModelNames(ctx, "x86_64")
	Expect(err).NotTo(HaveOccurred())
	expanded := map[string][]string{}
	for _, m := range models {
		_, features, err := lib.Expand(ctx, cpumap.CPU{Arch: "x86_64", Model: m})
		Expect(err).NotTo(HaveOccurred(), "model %s", m)
		expanded[m] = features
	}
	root := GinkgoT().TempDir()
	dirs := make([]string, len(hosts))
	for i, h := range hosts {
		dirs[i] = filepath.Join(root, h.Name)
		Expect(os.Mkdir(dirs[i], 0o755)).To(Succeed())
		labellerFiles(ctx, lib, models, expanded, h, dirs[i])
	}
	cmd := exec.CommandContext(ctx, oracle, append([]string{"node-labels", "--kubevirt", kubevirtCR}, dirs...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "kubevirt-oracle node-labels: %s", stderr.String())
	var all []map[string]string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var line struct {
			Source string            `json:"source"`
			Labels map[string]string `json:"labels"`
			Error  string            `json:"error"`
		}
		Expect(json.Unmarshal(sc.Bytes(), &line)).To(Succeed())
		Expect(line.Error).To(BeEmpty(), "kubevirt-oracle node-labels %s", line.Source)
		all = append(all, line.Labels)
	}
	Expect(all).To(HaveLen(len(hosts)))
	return all
}

// domCapsXML and hostCPUXML are the shapes `virsh domcapabilities` and `virsh
// hypervisor-cpu-baseline --features` print, as much of them as KubeVirt's node labeller reads.
type domCapsXML struct {
	XMLName xml.Name  `xml:"domainCapabilities"`
	Modes   []modeXML `xml:"cpu>mode"`
}

type modeXML struct {
	Name      string       `xml:"name,attr"`
	Supported string       `xml:"supported,attr"`
	Models    []modelXML   `xml:"model"`
	Vendor    string       `xml:"vendor,omitempty"`
	Features  []featureXML `xml:"feature"`
}

type modelXML struct {
	Name     string `xml:",chardata"`
	Usable   string `xml:"usable,attr,omitempty"`
	Fallback string `xml:"fallback,attr,omitempty"`
}

type featureXML struct {
	Policy string `xml:"policy,attr"`
	Name   string `xml:"name,attr"`
}

type hostCPUXML struct {
	XMLName  xml.Name     `xml:"cpu"`
	Mode     string       `xml:"mode,attr"`
	Match    string       `xml:"match,attr"`
	Model    modelXML     `xml:"model"`
	Vendor   string       `xml:"vendor"`
	Features []featureXML `xml:"feature"`
}

// labellerFiles writes into dir what libvirt says of h, as node-labeller.sh has it written:
// virsh_domcapabilities.xml (host-model: h's model and vendor, with the features h has beyond
// or lacks from it; custom: every model libvirt knows, usable when h has every feature libvirt
// expands it to, as QEMU judges usability by features alone) and supported_features.xml (h's
// CPU with every feature libvirt expands it to, policy require).
func labellerFiles(ctx context.Context, lib *cpumap.Libvirt, models []string, expanded map[string][]string, h CPUHost, dir string) {
	GinkgoHelper()
	_, hostFeatures, err := lib.Expand(ctx, h.CPU)
	Expect(err).NotTo(HaveOccurred(), "host %s", h.Name)
	has := map[string]bool{}
	for _, f := range hostFeatures {
		has[f] = true
	}
	hostModel := modeXML{Name: "host-model", Supported: "yes", Vendor: h.CPU.Vendor,
		Models: []modelXML{{Name: h.CPU.Model, Fallback: "forbid"}}}
	for _, f := range h.CPU.Require {
		hostModel.Features = append(hostModel.Features, featureXML{Policy: "require", Name: f})
	}
	for _, f := range h.CPU.Disable {
		hostModel.Features = append(hostModel.Features, featureXML{Policy: "disable", Name: f})
	}
	custom := modeXML{Name: "custom", Supported: "yes"}
	for _, m := range models {
		usable := "yes"
		for _, f := range expanded[m] {
			if !has[f] {
				usable = "no"
				break
			}
		}
		custom.Models = append(custom.Models, modelXML{Name: m, Usable: usable})
	}
	caps, err := xml.MarshalIndent(domCapsXML{Modes: []modeXML{{Name: "host-passthrough", Supported: "yes"}, hostModel, custom}}, "", "  ")
	Expect(err).NotTo(HaveOccurred())
	supported := hostCPUXML{Mode: "custom", Match: "exact", Model: modelXML{Name: h.CPU.Model, Fallback: "forbid"}, Vendor: h.CPU.Vendor}
	for _, f := range hostFeatures {
		supported.Features = append(supported.Features, featureXML{Policy: "require", Name: f})
	}
	features, err := xml.MarshalIndent(supported, "", "  ")
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(dir, "virsh_domcapabilities.xml"), caps, 0o644)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(dir, "supported_features.xml"), features, 0o644)).To(Succeed())
}
