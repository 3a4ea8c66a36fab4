//go:build libvirt

package fidelity_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// subject is one VM or VMI and what each oracle said of it.
type subject struct {
	source   string // file the object came from
	kind     string
	name     string
	original []byte // JSON
	// defaulted is the object virt-rules defaulted (nil when it refused: refused says why).
	defaulted []byte
	fields    []string // the fields virt-rules set
	warnings  []string // what virt-rules left to the node
	refused   error
	// KubeVirt's answers: the VMI its mutators make of the original, and the domain its
	// converter makes of each, as libvirt reads it back.
	vmi           map[string]any
	guest         *libvirtxml.Domain
	guestXML      string
	defaultedXML  string
	convertErr    string
	admitted      *admission
	defaultedNote string
	// kubevirtAdmits is KubeVirt's VM validating webhook on the original (with the instancetypes
	// and preferences of the examples in the cluster).
	kubevirtAdmits *admission
}

// references are the instancetypes and preferences of the examples (KubeVirt's and
// virt-rules'), as JSON, in the order read: what VMs refer to. Every oracle call has them first
// in its stream, so that KubeVirt's code finds them; the defaulter finds them in referenced.
var (
	references [][]byte
	referenced = defaults.Objects{}
)

// The objects: every VirtualMachine and VirtualMachineInstance in KubeVirt's examples/ and in
// virt-rules' examples/defaults/.
func subjects() []*subject {
	GinkgoHelper()
	version := strings.TrimSpace(run(oracle, "version"))
	first := len(references) == 0
	files, moduleDir, err := testcluster.VMExampleFiles(ctx, repoRoot, version)
	Expect(err).NotTo(HaveOccurred())
	objs, err := manifest.Read(files, nil)
	Expect(err).NotTo(HaveOccurred())
	var out2 []*subject
	for _, o := range objs {
		if referenced.Add(o.Object) {
			// Read again for another cluster, they are kept once.
			if first {
				raw, err := o.MarshalJSON()
				Expect(err).NotTo(HaveOccurred())
				references = append(references, raw)
			}
			continue
		}
		if o.GetAPIVersion() != "kubevirt.io/v1" || (o.GetKind() != "VirtualMachine" && o.GetKind() != "VirtualMachineInstance") {
			continue
		}
		if o.GetNamespace() == "" {
			o.SetNamespace("default")
		}
		raw, err := o.MarshalJSON()
		Expect(err).NotTo(HaveOccurred())
		source := o.Source
		if rel, err := filepath.Rel(moduleDir, source); err == nil && !strings.HasPrefix(rel, "..") {
			source = "kubevirt " + version + " " + rel
		} else if rel, err := filepath.Rel(repoRoot, source); err == nil {
			source = rel
		}
		out2 = append(out2, &subject{source: source, kind: o.GetKind(), name: o.GetName(), original: raw})
		// KubeVirt's instancetype examples set the guest's memory, which their instancetype
		// sets too: KubeVirt refuses them as they are. Each is judged also as a user would fix
		// it, without that field, so that KubeVirt's instancetypes and preferences are applied.
		if _, it, _ := unstructured.NestedMap(o.Object, "spec", "instancetype"); it {
			if _, set, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "template", "spec", "domain", "memory", "guest"); set {
				fixed := o.DeepCopy()
				unstructured.RemoveNestedField(fixed.Object, "spec", "template", "spec", "domain", "memory", "guest")
				raw, err := fixed.MarshalJSON()
				Expect(err).NotTo(HaveOccurred())
				out2 = append(out2, &subject{source: source + ", without domain.memory.guest", kind: o.GetKind(), name: o.GetName(), original: raw})
			}
		}
	}
	Expect(len(out2)).To(BeNumerically(">", 30), "KubeVirt's examples hold some 35 VMs and VMIs")
	return out2
}

func (s *subject) String() string { return fmt.Sprintf("%s %s (%s)", s.kind, s.name, s.source) }

func run(name string, args ...string) string {
	GinkgoHelper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "%s %v: %s", name, args, stderr.String())
	return string(out)
}

// flavour is a cluster the suite judges in: its KubeVirt CR (testdata) and the architecture
// of its nodes and control plane, as kubevirt-oracle's -arch gives them.
type flavour struct {
	arch, kubevirt string
}

var (
	amd64Cluster = flavour{arch: "amd64", kubevirt: "kubevirt.yaml"}
	arm64Cluster = flavour{arch: "arm64", kubevirt: "kubevirt-arm64.yaml"}
)

// oracleLines runs kubevirt-oracle COMMAND on objs (one YAML stream) for the amd64 cluster and
// decodes its JSON Lines, one per object, in order.
func oracleLines[T any](command string, objs [][]byte, flags ...string) []T {
	GinkgoHelper()
	return oracleLinesIn[T](amd64Cluster, command, objs, flags...)
}

// cluster is the flavour's KubeVirt CR, as the defaulter reads it.
func (f flavour) cluster() *engine.VMCluster {
	GinkgoHelper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "test", "fidelity", "testdata", f.kubevirt))
	Expect(err).NotTo(HaveOccurred())
	var kv map[string]any
	Expect(yaml.Unmarshal(raw, &kv)).To(Succeed())
	c, err := engine.NewVMCluster(kv)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// oracleLinesIn runs kubevirt-oracle COMMAND on objs in the cluster fl.
func oracleLinesIn[T any](fl flavour, command string, objs [][]byte, flags ...string) []T {
	GinkgoHelper()
	f, err := os.CreateTemp(GinkgoT().TempDir(), "objects-*.yaml")
	Expect(err).NotTo(HaveOccurred())
	objs = append(slices.Clone(references), objs...)
	for _, o := range objs {
		y, err := yaml.JSONToYAML(o)
		Expect(err).NotTo(HaveOccurred())
		fmt.Fprintf(f, "---\n%s", y)
	}
	Expect(f.Close()).To(Succeed())
	kubevirt := filepath.Join(repoRoot, "test", "fidelity", "testdata", fl.kubevirt)
	out := run(oracle, append(append([]string{command, "--kubevirt", kubevirt, "--arch", fl.arch}, flags...), f.Name())...)
	var lines []T
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var line T
		Expect(json.Unmarshal(sc.Bytes(), &line)).To(Succeed(), "kubevirt-oracle %s: %s", command, sc.Text())
		lines = append(lines, line)
	}
	Expect(lines).To(HaveLen(len(objs)), "kubevirt-oracle %s answers once per object", command)
	return lines[len(references):]
}

type admission struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Allowed bool   `json:"allowed"`
	Message string `json:"message"`
	Causes  []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"causes"`
	Warnings []string `json:"warnings"`
}

type conversion struct {
	Kind   string         `json:"kind"`
	Name   string         `json:"name"`
	VMI    map[string]any `json:"vmi"`
	Domain string         `json:"domain"`
	Notes  []string       `json:"notes"`
	Error  string         `json:"error"`
}

// guestOf defines KubeVirt's domain for vmi in the suite's libvirt and reads it back: libvirt
// fills in what the node's libvirt would (PCI addresses, controllers, models).
//
// kubevirt-oracle gives the domain as KubeVirt's converter makes it. Before defining it,
// virt-launcher reserves PCIe root ports for hotplugging NICs (allocateHotplugPorts, which
// needs libvirt, so the oracle cannot): it appends placeholder NICs, 4 NICs in all for a VM
// with any, defines the domain, keeps the root ports libvirt added for them and drops them.
// The suite appends the same placeholders (KubeVirt v1.8's v1 count, its placeholder NIC) and
// keeps them: the real devices get the addresses they get on a node.
func guestOf(domainXML string, vmi map[string]any) (*libvirtxml.Domain, string, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(domainXML); err != nil {
		return nil, "", fmt.Errorf("KubeVirt's domain XML: %w", err)
	}
	d.Type = "qemu" // the suite's libvirt may have no KVM; defaults are the same
	maxMemory := ""
	if m := d.MaximumMemory; m != nil {
		// KubeVirt writes <maxMemory slots='0'> (memory hotplug by virtio-mem, no DIMM slots),
		// which the suite's libvirt (Debian 12's 9.0) refuses; KubeVirt's libvirt accepts it.
		// The suite defines the domain without it and keeps its value for comparisons.
		maxMemory = fmt.Sprintf("\n<!-- maxMemory %d %s -->", m.Value, m.Unit)
		d.MaximumMemory = nil
	}
	// The suite's libvirt has no swtpm: the TPM (no PCI device on q35) is left out of both
	// domains compared.
	d.Devices.TPMs = nil
	ifaces, _ := get(vmi, "spec", "domain", "devices", "interfaces").([]any)
	if n := len(ifaces); n > 0 && n < 4 && get(vmi, "metadata", "annotations", "kubevirt.io/placePCIDevicesOnRootComplex") != "true" {
		model := "virtio-non-transitional"
		if get(vmi, "spec", "domain", "devices", "useVirtioTransitional") == true {
			model = "virtio-transitional"
		}
		for i := range 4 - n {
			name := fmt.Sprintf("placeholder-%d", i)
			d.Devices.Interfaces = append(d.Devices.Interfaces, libvirtxml.DomainInterface{
				Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
				Model:  &libvirtxml.DomainInterfaceModel{Type: model},
				Alias:  &libvirtxml.DomainAlias{Name: name},
				Target: &libvirtxml.DomainInterfaceTarget{Dev: name, Managed: "no"},
			})
		}
	}
	// The libvirt asked gives every domain a UUID of its own; KubeVirt's SMBIOS repeats the
	// firmware UUID, which libvirt requires to match.
	for i := range d.SysInfo {
		if sm := d.SysInfo[i].SMBIOS; sm != nil && sm.System != nil {
			sm.System.Entry = slices.DeleteFunc(sm.System.Entry, func(e libvirtxml.DomainSysInfoEntry) bool { return e.Name == "uuid" })
		}
	}
	out, err := lv.DefineAndRead(ctx, &d)
	if err != nil {
		return nil, "", err
	}
	var back libvirtxml.Domain
	if err := back.Unmarshal(string(out)); err != nil {
		return nil, "", err
	}
	return &back, string(out) + maxMemory, nil
}

var (
	_ = Describe("VM defaults, judged by KubeVirt's admission, KubeVirt's converter and libvirt", Ordered, ContinueOnFailure, func() {
		judgedIn(amd64Cluster)
	})
	// The same examples in a cluster of arm64 nodes whose KubeVirt CR defaults to arm64: what
	// KubeVirt's arm64 mutator, admitters and converter make of them (Debian's qemu-system-arm
	// under the suite's libvirt, TCG).
	_ = Describe("VM defaults on arm64, judged by KubeVirt's arm64 admission and converter and libvirt", Ordered, ContinueOnFailure, func() {
		judgedIn(arm64Cluster)
	})
)

// judgedIn is the suite's judgement of every example in the cluster fl.
func judgedIn(fl flavour) {
	var all []*subject

	var withReferences *defaults.Defaulter
	BeforeAll(func() {
		all = subjects()
		d := *defaulter
		d.Finder = referenced
		d.Cluster = fl.cluster()
		withReferences = &d
		for _, s := range all {
			res, err := withReferences.Default(ctx, s.original)
			if err != nil {
				s.refused = err
				continue
			}
			s.defaulted, s.fields, s.warnings = res.Object, res.Defaults, res.Warnings
		}
		var originals, defaulted [][]byte
		var withDefaults []*subject
		for _, s := range all {
			originals = append(originals, s.original)
			if s.defaulted != nil {
				defaulted = append(defaulted, s.defaulted)
				withDefaults = append(withDefaults, s)
			}
		}
		for i, c := range oracleLinesIn[conversion](fl, "convert", originals) {
			s := all[i]
			s.vmi = c.VMI
			if c.Error != "" {
				s.convertErr = c.Error
				continue
			}
			var err error
			if s.guest, s.guestXML, err = guestOf(c.Domain, c.VMI); err != nil {
				s.convertErr = "libvirt refused KubeVirt's domain: " + err.Error()
			}
		}
		for i, c := range oracleLinesIn[conversion](fl, "convert", defaulted) {
			s := withDefaults[i]
			if c.Error != "" {
				s.defaultedNote = "KubeVirt cannot convert the defaulted object: " + c.Error
				continue
			}
			if _, xml, err := guestOf(c.Domain, c.VMI); err != nil {
				s.defaultedNote = "libvirt refused KubeVirt's domain of the defaulted object: " + err.Error()
			} else {
				s.defaultedXML = xml
			}
		}
		for i, a := range oracleLinesIn[admission](fl, "admit", defaulted) {
			withDefaults[i].admitted = &a
		}
		for i, a := range oracleLinesIn[admission](fl, "admit", originals, "--mutate") {
			all[i].kubevirtAdmits = &a
		}
	})

	It("defaults every example or says why not, naming what is left to the host", func() {
		var refused []string
		for _, s := range all {
			if s.refused == nil {
				continue
			}
			var invalid *defaults.InvalidError
			if errors.As(s.refused, &invalid) && invalid.Unsupported() {
				AddReportEntry("left undefaulted", fmt.Sprintf("%s: %v", s, s.refused))
				continue
			}
			// Refused as KubeVirt's VM admitter refuses it (a field its instancetype sets):
			// each of KubeVirt's causes is one of virt-rules'.
			if k := s.kubevirtAdmits; errors.As(s.refused, &invalid) && k != nil && !k.Allowed && len(k.Causes) > 0 {
				ours := map[string]bool{}
				for _, c := range invalid.Causes {
					ours[c.Field] = true
				}
				agree := true
				for _, c := range k.Causes {
					agree = agree && ours[c.Field]
				}
				if agree {
					AddReportEntry("refused as KubeVirt refuses it", fmt.Sprintf("%s: %v; KubeVirt: %s", s, s.refused, k.Message))
					continue
				}
			}
			// Refused as virt-api refuses the VMI KubeVirt starts of it (arm64's checks run
			// there, on the mutated VMI): each of virt-rules' causes in KubeVirt's words.
			if errors.As(s.refused, &invalid) && strings.Contains(s.convertErr, "validating webhook refused it") && len(invalid.Causes) > 0 {
				agree := true
				for _, c := range invalid.Causes {
					words, _, _ := strings.Cut(c.Message, " (")
					agree = agree && strings.Contains(s.convertErr, words)
				}
				if agree {
					AddReportEntry("refused as KubeVirt refuses its VMI", fmt.Sprintf("%s: %v; KubeVirt: %s", s, s.refused, s.convertErr))
					continue
				}
			}
			refused = append(refused, fmt.Sprintf("%s: %v", s, s.refused))
		}
		Expect(refused).To(BeEmpty(), "objects KubeVirt admits that virt-rules refuses as invalid")
	})

	It("names every value it leaves to the node (host devices), and warns of nothing else", func() {
		var silent, needless []string
		for _, s := range all {
			if s.defaulted == nil {
				continue
			}
			var obj map[string]any
			Expect(json.Unmarshal(s.original, &obj)).To(Succeed())
			spec := specOf(s.kind, obj)
			hostDevices := get(spec, "domain", "devices", "gpus") != nil || get(spec, "domain", "devices", "hostDevices") != nil
			ifaces, _ := get(spec, "domain", "devices", "interfaces").([]any)
			for _, iface := range ifaces {
				hostDevices = hostDevices || get(iface, "sriov") != nil
			}
			// What is left to a VM's instancetype and preference is named apart.
			var toNode, toReferences []string
			for _, w := range s.warnings {
				if strings.HasPrefix(w, "spec.instancetype: ") || strings.HasPrefix(w, "spec.preference: ") {
					toReferences = append(toReferences, w)
				} else {
					toNode = append(toNode, w)
				}
			}
			if get(obj, "spec", "instancetype") != nil || get(obj, "spec", "preference") != nil {
				if len(toReferences) == 0 {
					silent = append(silent, s.String()+" (its instancetype or preference)")
				}
				AddReportEntry("left to its instancetype and preference", fmt.Sprintf("%s: %s", s, strings.Join(toReferences, "; ")))
			}
			switch {
			case hostDevices && len(toNode) == 0:
				silent = append(silent, s.String())
			case !hostDevices && len(toNode) > 0:
				needless = append(needless, fmt.Sprintf("%s: %v", s, toNode))
			case hostDevices:
				AddReportEntry("left to the node", fmt.Sprintf("%s: %s", s, strings.Join(toNode, "; ")))
			}
		}
		Expect(silent).To(BeEmpty(), "objects with host devices defaulted without a warning")
		Expect(needless).To(BeEmpty())
	})

	It("has KubeVirt convert every example it defaults, and libvirt define the domain", func() {
		var failed []string
		for _, s := range all {
			switch {
			case s.convertErr == "":
			case s.defaulted == nil:
				AddReportEntry("not converted, not defaulted", fmt.Sprintf("%s: %s", s, s.convertErr))
			case notJudged[filepath.Base(s.source)] != "" && strings.Contains(s.convertErr, notJudged[filepath.Base(s.source)]):
				AddReportEntry("not judged", fmt.Sprintf("%s: %s", s, s.convertErr))
			case s.vmi != nil && get(s.vmi, "spec", "architecture") != fl.arch:
				// Its VMI is of another architecture (a preference's preferredArchitecture):
				// KubeVirt schedules it to a node of that one (kubernetes.io/arch), which this
				// cluster has none of, and this cluster's launcher cannot convert it.
				AddReportEntry("not judged: a VMI of another architecture", fmt.Sprintf("%s: %v on %s nodes: %s", s, get(s.vmi, "spec", "architecture"), fl.arch, s.convertErr))
			default:
				failed = append(failed, fmt.Sprintf("%s: %s", s, s.convertErr))
			}
		}
		Expect(failed).To(BeEmpty())
	})

	It("(a) has KubeVirt's validation admit every defaulted object as it is", func() {
		var refused []string
		for _, s := range all {
			if s.admitted != nil && !s.admitted.Allowed {
				refused = append(refused, fmt.Sprintf("%s: %s %v", s, s.admitted.Message, s.admitted.Causes))
			}
		}
		Expect(refused).To(BeEmpty())
	})

	It("(b) writes the guest-visible values KubeVirt's converter and libvirt give the original", func() {
		compared, mismatches := 0, []string{}
		for _, s := range all {
			if s.defaulted == nil || s.guest == nil {
				continue
			}
			c, m := compareFields(s)
			compared += c
			mismatches = append(mismatches, m...)
		}
		AddReportEntry("guest-visible fields compared", compared)
		fmt.Fprintf(GinkgoWriter, "FIDELITY (b): %d guest-visible fields compared, %d mismatches\n", compared, len(mismatches))
		Expect(compared).To(BeNumerically(">", 100))
		Expect(mismatches).To(BeEmpty())
	})

	It("(c) gives the same guest when KubeVirt converts the defaulted object as when it converts the original", func() {
		var differ []string
		for _, s := range all {
			if s.defaulted == nil || s.guest == nil {
				continue
			}
			if s.defaultedNote != "" {
				differ = append(differ, fmt.Sprintf("%s: %s", s, s.defaultedNote))
				continue
			}
			a, b := normalizedGuest(s, s.guestXML), normalizedGuest(s, s.defaultedXML)
			if a != b {
				differ = append(differ, fmt.Sprintf("%s:\n%s", s, lineDiff(a, b)))
			}
		}
		Expect(differ).To(BeEmpty())
	})

	It("(d) is a fixed point: defaulting a defaulted object changes nothing", func() {
		var changed []string
		for _, s := range all {
			if s.defaulted == nil {
				continue
			}
			res, err := withReferences.Default(ctx, s.defaulted)
			if err != nil {
				changed = append(changed, fmt.Sprintf("%s: %v", s, err))
				continue
			}
			if len(res.Defaults) > 0 {
				changed = append(changed, fmt.Sprintf("%s: sets %v again", s, res.Defaults))
			}
		}
		Expect(changed).To(BeEmpty())
	})
}

// notJudged are the example files KubeVirt's converter cannot convert outside a node, and why
// (README, "VM defaults beside KubeVirt"): a VMI with dedicated CPUs needs the CPU set
// virt-handler gives its pod.
var notJudged = map[string]string{
	"vmi-fedora-isolated.yaml": "not enough exclusive threads",
}

// specOf is the VirtualMachineInstance spec of a VM or VMI (JSON).
func specOf(kind string, obj map[string]any) map[string]any {
	spec, _ := obj["spec"].(map[string]any)
	if kind == "VirtualMachine" {
		t, _ := spec["template"].(map[string]any)
		spec, _ = t["spec"].(map[string]any)
	}
	return spec
}

func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// compareFields compares each field virt-rules set in s with what KubeVirt (its mutated VMI,
// its domain as libvirt read it back) has for it, and returns how many it compared and the
// mismatches.
func compareFields(s *subject) (int, []string) {
	var obj map[string]any
	Expect(json.Unmarshal(s.defaulted, &obj)).To(Succeed())
	spec := specOf(s.kind, obj)
	prefix := "spec."
	if s.kind == "VirtualMachine" {
		prefix = "spec.template.spec."
	}
	compared := 0
	var mismatches []string
	check := func(field string, ours, theirs any) {
		compared++
		if fmt.Sprint(ours) != fmt.Sprint(theirs) {
			mismatches = append(mismatches, fmt.Sprintf("%s: %s: virt-rules wrote %v, KubeVirt gives %v", s, field, ours, theirs))
		}
	}
	g := s.guest
	vmiSpec := get(s.vmi, "spec")
	for _, f := range s.fields {
		field := strings.TrimPrefix(f, prefix)
		path := splitField(field)
		ours := get(spec, path...)
		// named is the name of the device field's device, in spec's list of such devices.
		named := func(list string) string {
			name, _ := get(spec, "domain", "devices", list, path[3].(int), "name").(string)
			return name
		}
		// missing checks that KubeVirt's domain has the device (found), a mismatch if not: the
		// device's fields are compared only if it has.
		missing := func(device string, found bool) bool {
			if !found {
				check(f, ours, "no such "+device+" in KubeVirt's domain")
			}
			return !found
		}
		last := path[len(path)-1]
		switch {
		case field == "architecture":
			check(f, ours, get(s.vmi, "spec", "architecture"))
		case field == "domain.memory.maxGuest":
			check(f, quantity(ours), quantity(get(s.vmi, "spec", "domain", "memory", "maxGuest")))
		case field == "domain.machine.type":
			check(f, ours, get(s.vmi, "spec", "domain", "machine", "type"))
		case field == "domain.cpu.model":
			check(f, ours, get(s.vmi, "spec", "domain", "cpu", "model"))
		case slices.Contains([]string{"domain.cpu.sockets", "domain.cpu.cores", "domain.cpu.threads", "domain.cpu.maxSockets"}, field):
			check(f, ours, get(vmiSpec, path...))
		case field == "domain.memory.guest":
			check(f, quantity(ours), quantity(get(s.vmi, "spec", "domain", "memory", "guest")))
		case field == "domain.firmware.bootloader.efi.secureBoot":
			// KubeVirt's arm64 mutator's bootloader, and the firmware its converter loads.
			check(f, ours, get(vmiSpec, path...))
			secure := "no such loader in KubeVirt's domain"
			if g.OS != nil && g.OS.Loader != nil {
				secure = g.OS.Loader.Secure
			}
			check(f+" (the domain's loader secure)", map[bool]string{true: "yes", false: "no"}[ours == true], secure)
		case field == "domain.firmware.uuid":
			// Not KubeVirt's: it draws one (a VMI) or derives it from the name alone (a VM);
			// virt-rules derives it from the namespace and name (README: firmware identity).
		case field == "domain.clock.utc":
			offset := "utc"
			if g.Clock != nil && g.Clock.Offset != "" {
				offset = g.Clock.Offset
			}
			check(f, "utc", offset)
		case field == "domain.devices.autoattachMemBalloon":
			check(f, ours, g.Devices.MemBalloon != nil && g.Devices.MemBalloon.Model != "none")
		case strings.HasPrefix(field, "domain.devices.interfaces["):
			nic := nicOf(g, named("interfaces"))
			switch {
			case missing("interface", nic != nil):
			case last == "model":
				model := ""
				if nic.Model != nil {
					model = nic.Model.Type
				}
				if strings.HasPrefix(model, "virtio") {
					model = "virtio"
				}
				check(f, ours, model)
			case last == "pciAddress":
				check(f, ours, pciOf(nic.Address))
			case last == "macAddress":
				// KubeVirt leaves a MAC the VM does not set to libvirt (random): compared
				// only where KubeVirt sets one.
				if get(specOf(s.kind, decode(s.original)), path...) != nil {
					check(f, ours, nic.MAC.Address)
				}
			default:
				check(f, ours, get(vmiSpec, path...))
			}
		case strings.HasPrefix(field, "domain.devices.disks["):
			disk := diskOf(g, named("disks"))
			switch {
			case missing("disk", disk != nil):
			case last == "bus":
				check(f, ours, disk.Target.Bus)
			case last == "pciAddress":
				check(f, ours, pciOf(disk.Address))
			default:
				check(f, ours, get(vmiSpec, path...))
			}
		case strings.HasPrefix(field, "domain.devices.inputs["):
			check(f, ours, get(vmiSpec, path...))
		case strings.HasPrefix(field, "networks["):
			check(f, ours, get(vmiSpec, path...))
		default:
			compared++
			mismatches = append(mismatches, fmt.Sprintf("%s: %s: virt-rules wrote %v, which this suite cannot judge", s, f, ours))
		}
	}
	return compared, mismatches
}

func decode(raw []byte) map[string]any {
	var m map[string]any
	Expect(json.Unmarshal(raw, &m)).To(Succeed())
	return m
}

func quantity(v any) string {
	s, ok := v.(string)
	if !ok {
		return fmt.Sprint(v)
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return s
	}
	return fmt.Sprint(q.Value())
}

// splitField splits domain.devices.disks[0].disk.bus into keys and indexes.
func splitField(field string) []any {
	var path []any
	for _, part := range strings.Split(field, ".") {
		name, rest, _ := strings.Cut(part, "[")
		path = append(path, name)
		for rest != "" {
			n, tail, _ := strings.Cut(rest, "]")
			var i int
			fmt.Sscan(n, &i)
			path = append(path, i)
			rest = strings.TrimPrefix(tail, "[")
		}
	}
	return path
}

func nicOf(d *libvirtxml.Domain, name string) *libvirtxml.DomainInterface {
	for i, n := range d.Devices.Interfaces {
		if n.Alias != nil && n.Alias.Name == "ua-"+name {
			return &d.Devices.Interfaces[i]
		}
	}
	return nil
}

func diskOf(d *libvirtxml.Domain, name string) *libvirtxml.DomainDisk {
	for i, k := range d.Devices.Disks {
		if k.Alias != nil && k.Alias.Name == "ua-"+name {
			return &d.Devices.Disks[i]
		}
	}
	return nil
}

func pciOf(a *libvirtxml.DomainAddress) string {
	if a == nil || a.PCI == nil || a.PCI.Domain == nil || a.PCI.Bus == nil || a.PCI.Slot == nil || a.PCI.Function == nil {
		return "no PCI address"
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", *a.PCI.Domain, *a.PCI.Bus, *a.PCI.Slot, *a.PCI.Function)
}

// normalizedGuest is a domain as libvirt read it back without what is not the guest's or
// differs by design between the original and the defaulted object: the name and UUIDs, the
// MACs libvirt drew (the original's NICs without a MAC), the SMBIOS UUID and serial.
func normalizedGuest(s *subject, xml string) string {
	xml, maxMemory, _ := strings.Cut(xml, "\n<!-- maxMemory ")
	var d libvirtxml.Domain
	Expect(d.Unmarshal(xml)).To(Succeed())
	d.Name, d.UUID = "", ""
	d.SecLabel, d.Metadata, d.Resource = nil, nil, nil
	originalSpec := specOf(s.kind, decode(s.original))
	for i := range d.Devices.Interfaces {
		n := &d.Devices.Interfaces[i]
		name := ""
		if n.Alias != nil {
			name = strings.TrimPrefix(n.Alias.Name, "ua-")
		}
		set := false
		for j := range 64 {
			if get(originalSpec, "domain", "devices", "interfaces", j, "name") == name {
				set = get(originalSpec, "domain", "devices", "interfaces", j, "macAddress") != nil
				break
			}
		}
		if !set && n.MAC != nil {
			n.MAC.Address = "(drawn)"
		}
	}
	for i := range d.SysInfo {
		if d.SysInfo[i].SMBIOS != nil && d.SysInfo[i].SMBIOS.System != nil {
			for j, e := range d.SysInfo[i].SMBIOS.System.Entry {
				if e.Name == "uuid" || e.Name == "serial" {
					d.SysInfo[i].SMBIOS.System.Entry[j].Value = "(identity)"
				}
			}
		}
	}
	out, err := d.Marshal()
	Expect(err).NotTo(HaveOccurred())
	return out + "\nmaxMemory " + maxMemory
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	count := map[string]int{}
	for _, l := range al {
		count[l]++
	}
	for _, l := range bl {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, "- "+strings.TrimSpace(l))
		case n < 0:
			out = append(out, "+ "+strings.TrimSpace(l))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
