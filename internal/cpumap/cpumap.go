//go:build libvirt

// Package cpumap asks the installed libvirt what its CPU models are made of (libvirt's cpu_map)
// and what CPU a group of hosts has in common (virConnectBaselineCPU), through libvirt's own API,
// so that the CPU baseline decision (rego/virtrules/node/baseline) reads a table generated from
// libvirt rather than copied by hand: Table, written by `make cpu-map` (hack/cpumap) to
// rego/virtrules/node/baseline/cpu_map/data.json, which this package's test keeps up to date.
//
// # Connection
//
// Open connects to test:///default, libvirt's test driver, which lives inside libvirt.so: no
// daemon, no KVM, no QEMU, no event loop and no files are needed. Its virConnectGetCPUModelNames
// and virConnectBaselineCPU run libvirt's real x86 CPU driver over the installed cpu_map, which
// is all this package needs. (virConnectBaselineHypervisorCPU and virConnectGetDomainCapabilities
// are not implemented by the test driver, and virConnectBaselineCPU refuses
// VIR_CONNECT_BASELINE_CPU_MIGRATABLE there; the embedded QEMU driver, qemu:///embed, is not
// needed.) Every call is a fraction of a millisecond; Table (58 x86_64 models on libvirt 9.0)
// takes about 70 ms from Open on 2 cores, 30 ms once the model vendors are cached, and
// marshals to 54 KB (2,933 lines).
//
// # What libvirt does (libvirt 9.0, measured by this package's tests)
//
// Host CPUs. virConnectBaselineCPU reads its input as host CPUs: an arch, a model, a vendor and
// features the host has. A feature's policy attribute is ignored there: <feature
// policy='disable' name='avx512f'/> in a host CPU says the host HAS avx512f. So a CPU's Disable
// is never handed to libvirt as such: Expand subtracts it from libvirt's expansion of the model
// plus Require (exact on x86, where every feature is its own CPUID or MSR bit), and Baseline
// rewrites a host with Disable into the equivalent host CPU libvirt can read (see Baseline).
//
// Vendors. cpu_map gives most models a vendor (Intel, AMD, Hygon); some have none (qemu64,
// kvm64, 486, pentium, ...). No API lists a model's vendor, and libvirt's answer names a vendor
// only when every host CPU it was given names one: the model's own vendor never appears in an
// answer. What libvirt does check: a host CPU that names a vendor other than its model's is an
// error ("CPU vendor Intel of model Skylake-Client differs from vendor AMD") for every host but
// the first (a single Skylake-Client host "of AMD" is accepted), and a vendor-less model accepts
// any vendor. ModelVendor learns a model's vendor from those checks, and Expand hands libvirt
// its CPU twice so that a wrong vendor is refused.
//
// Mixed vendors. Baseline of an Intel and an AMD host that name their vendors fails ("CPU vendors
// do not match"). When the hosts name no vendor, libvirt does not fail: it takes the vendor of
// the second and later hosts' models (never the first's), and answers a vendor-less CPU that
// depends on the order: Skylake-Client then EPYC gives kvm64 plus features, EPYC then
// Skylake-Client gives Skylake-Client minus features. Name the vendors (as KubeVirt's node
// labels do) to get the error.
//
// Models of one name. Expand of a model returns exactly that model's features and vendor as its
// cpu_map file defines them (TestExpandIsCPUMapFile reads the files: all 58 agree; inherited
// models included; features cpu_map marks removed='yes', such as Icelake-Client's intel-pt, are
// not features of the model, and libvirt's answer lists them disabled). libvirt may answer another model's
// name for them: the TSX-less models (Cascadelake-Server-noTSX, Icelake-Server-noTSX,
// Skylake-Server-noTSX-IBRS, ...) and cpu64-rhel5/6 are not decoded to (cpu_map's guest='off'),
// so Cascadelake-Server-noTSX comes back as Cascadelake-Server with hle and rtm disabled. Table
// keys models by the name asked, so every model libvirt lists has its own entry.
package cpumap

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"sync"

	"libvirt.org/go/libvirt"
)

// URI is the libvirt connection Open makes: the test driver, inside libvirt.so.
const URI = "test:///default"

// Arch is the architecture Table covers, and the default of a CPU without one.
const Arch = "x86_64"

// CPU is a host or guest CPU as libvirt's <cpu> XML names it: a model of an arch, its vendor
// (empty: the model's own, or none) and the features required on top of the model and disabled
// from it.
type CPU struct {
	Arch    string   `json:"arch,omitempty"`
	Model   string   `json:"model"`
	Vendor  string   `json:"vendor,omitempty"`
	Require []string `json:"require,omitempty"`
	Disable []string `json:"disable,omitempty"`
}

func (c CPU) arch() string {
	if c.Arch == "" {
		return Arch
	}
	return c.Arch
}

// Libvirt is a connection to libvirt's test driver (URI). It is safe for concurrent use.
type Libvirt struct {
	conn *libvirt.Connect

	mu      sync.Mutex
	vendors map[string]string // by arch + "/" + model
	base    map[string]string // by arch: the vendor-less model with the fewest features
}

// Open connects to libvirt (URI). Close it when done.
func Open(ctx context.Context) (*Libvirt, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := libvirt.NewConnect(URI)
	if err != nil {
		return nil, fmt.Errorf("cpumap: connect %s: %w", URI, err)
	}
	return &Libvirt{conn: conn, vendors: map[string]string{}, base: map[string]string{}}, nil
}

// Close closes the connection.
func (l *Libvirt) Close() error {
	if _, err := l.conn.Close(); err != nil {
		return fmt.Errorf("cpumap: close: %w", err)
	}
	return nil
}

// Version is the libvirt library's version, such as "9.0.0".
func (l *Libvirt) Version() (string, error) {
	v, err := l.conn.GetLibVersion()
	if err != nil {
		return "", fmt.Errorf("cpumap: libvirt version: %w", err)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000), nil
}

// ModelNames are the CPU models libvirt knows for arch (virConnectGetCPUModelNames), sorted.
func (l *Libvirt) ModelNames(ctx context.Context, arch string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	names, err := l.conn.GetCPUModelNames(arch, 0)
	if err != nil {
		return nil, fmt.Errorf("cpumap: CPU models of %s: %w", arch, err)
	}
	sort.Strings(names)
	return names, nil
}

// Expand is the full feature list of cpu's model plus cpu.Require minus cpu.Disable, sorted, as
// libvirt resolves it through cpu_map (virConnectBaselineCPU of that one CPU with
// VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES; Disable subtracted here, see the package doc), and
// its vendor: cpu.Vendor if given (libvirt fails if the model is of another vendor), else the
// model's (ModelVendor), empty for a vendor-less model.
func (l *Libvirt) Expand(ctx context.Context, cpu CPU) (vendor string, features []string, err error) {
	vendor = cpu.Vendor
	if vendor == "" {
		if vendor, err = l.ModelVendor(ctx, cpu.arch(), cpu.Model); err != nil {
			return "", nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	// Twice: libvirt checks a host's vendor against its model's for every host but the first.
	host := hostXML(CPU{Arch: cpu.arch(), Model: cpu.Model, Vendor: vendor, Require: cpu.Require})
	out, err := l.conn.BaselineCPU([]string{host, host}, libvirt.CONNECT_BASELINE_CPU_EXPAND_FEATURES)
	if err != nil {
		return "", nil, fmt.Errorf("cpumap: expand %s model %s: %w", cpu.arch(), cpu.Model, err)
	}
	got, err := parseCPU(out, cpu.arch())
	if err != nil {
		return "", nil, fmt.Errorf("cpumap: expand %s model %s: %w", cpu.arch(), cpu.Model, err)
	}
	return got.Vendor, without(got.Require, cpu.Disable), nil
}

// ModelVendor is the vendor cpu_map gives model ("Intel", "AMD", "Hygon"), empty for a model of
// none. libvirt has no call for it: a host CPU naming a vendor other than its model's is
// refused with "CPU vendor V of model M differs from vendor W" and a vendor-less model takes
// any, so ModelVendor asks libvirt for the baseline of the model as Intel and as AMD hosts: both
// accepted, no vendor; else the vendor the refusal names, checked by a baseline that accepts it.
// Answers are cached.
func (l *Libvirt) ModelVendor(ctx context.Context, arch, model string) (string, error) {
	key := arch + "/" + model
	l.mu.Lock()
	v, ok := l.vendors[key]
	l.mu.Unlock()
	if ok {
		return v, nil
	}
	try := func(vendor string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		host := hostXML(CPU{Arch: arch, Model: model, Vendor: vendor})
		_, err := l.conn.BaselineCPU([]string{host, host}, 0)
		return err
	}
	named := ""
	accepted := 0
	for _, probe := range []string{"Intel", "AMD"} {
		err := try(probe)
		if err == nil {
			accepted++
			continue
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		m := vendorDiffers.FindStringSubmatch(libvirtMessage(err))
		if m == nil {
			return "", fmt.Errorf("cpumap: vendor of %s model %s: %w", arch, model, err)
		}
		named = m[1]
	}
	switch {
	case accepted == 2:
		v = ""
	case named == "":
		return "", fmt.Errorf("cpumap: vendor of %s model %s: libvirt neither accepted nor named one", arch, model)
	default:
		if err := try(named); err != nil {
			return "", fmt.Errorf("cpumap: vendor of %s model %s: libvirt named %s, then refused it: %w", arch, model, named, err)
		}
		v = named
	}
	l.mu.Lock()
	l.vendors[key] = v
	l.mu.Unlock()
	return v, nil
}

var vendorDiffers = regexp.MustCompile(`CPU vendor (\S+) of model \S+ differs from vendor`)

func libvirtMessage(err error) string {
	var lerr libvirt.Error
	if errors.As(err, &lerr) {
		return lerr.Message
	}
	return err.Error()
}

// Baseline is libvirt's own baseline of the host CPUs (virConnectBaselineCPU) as libvirt answers
// it: a model, the vendor (only when every host names one), the features required on top of the
// model and disabled from it; and the answer's full feature list
// (VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES), sorted. A host is its model plus Require minus
// Disable. libvirt cannot read a host CPU's Disable (see the package doc), so a host with Disable
// is handed to libvirt as the vendor-less model with the fewest features (486 on x86) plus every
// feature of its expansion (Expand), with its vendor (given, or its model's): the same CPU to
// libvirt. Hosts of different vendors that name them are an error; see the package doc for
// hosts that do not name them.
func (l *Libvirt) Baseline(ctx context.Context, hosts []CPU) (CPU, []string, error) {
	if len(hosts) == 0 {
		return CPU{}, nil, errors.New("cpumap: baseline of no hosts")
	}
	arch := hosts[0].arch()
	xmls := make([]string, 0, len(hosts))
	for i, h := range hosts {
		if h.arch() != arch {
			return CPU{}, nil, fmt.Errorf("cpumap: baseline: host %d is %s, host 0 is %s", i, h.arch(), arch)
		}
		if len(h.Disable) == 0 {
			xmls = append(xmls, hostXML(h))
			continue
		}
		vendor, features, err := l.Expand(ctx, h)
		if err != nil {
			return CPU{}, nil, fmt.Errorf("cpumap: baseline: host %d: %w", i, err)
		}
		base, err := l.baseModel(ctx, arch)
		if err != nil {
			return CPU{}, nil, err
		}
		_, baseFeatures, err := l.Expand(ctx, CPU{Arch: arch, Model: base})
		if err != nil {
			return CPU{}, nil, err
		}
		if missing := without(baseFeatures, features); len(missing) > 0 {
			return CPU{}, nil, fmt.Errorf("cpumap: baseline: host %d (%s minus %v) lacks features of %s, the smallest model: %v", i, h.Model, h.Disable, base, missing)
		}
		xmls = append(xmls, hostXML(CPU{Arch: arch, Model: base, Vendor: vendor, Require: features}))
	}
	if err := ctx.Err(); err != nil {
		return CPU{}, nil, err
	}
	out, err := l.conn.BaselineCPU(xmls, 0)
	if err != nil {
		return CPU{}, nil, fmt.Errorf("cpumap: baseline of %d %s hosts: %w", len(hosts), arch, err)
	}
	cpu, err := parseCPU(out, arch)
	if err != nil {
		return CPU{}, nil, fmt.Errorf("cpumap: baseline of %d %s hosts: %w", len(hosts), arch, err)
	}
	if err := ctx.Err(); err != nil {
		return CPU{}, nil, err
	}
	out, err = l.conn.BaselineCPU(xmls, libvirt.CONNECT_BASELINE_CPU_EXPAND_FEATURES)
	if err != nil {
		return CPU{}, nil, fmt.Errorf("cpumap: expanded baseline of %d %s hosts: %w", len(hosts), arch, err)
	}
	expanded, err := parseCPU(out, arch)
	if err != nil {
		return CPU{}, nil, fmt.Errorf("cpumap: expanded baseline of %d %s hosts: %w", len(hosts), arch, err)
	}
	return cpu, expanded.Require, nil
}

// baseModel is arch's vendor-less model with the fewest features (ties: the first by name).
func (l *Libvirt) baseModel(ctx context.Context, arch string) (string, error) {
	l.mu.Lock()
	base, ok := l.base[arch]
	l.mu.Unlock()
	if ok {
		return base, nil
	}
	names, err := l.ModelNames(ctx, arch)
	if err != nil {
		return "", err
	}
	least := -1
	for _, name := range names {
		vendor, features, err := l.Expand(ctx, CPU{Arch: arch, Model: name})
		if err != nil {
			return "", err
		}
		if vendor == "" && (least < 0 || len(features) < least) {
			base, least = name, len(features)
		}
	}
	if least < 0 {
		return "", fmt.Errorf("cpumap: %s has no vendor-less CPU model", arch)
	}
	l.mu.Lock()
	l.base[arch] = base
	l.mu.Unlock()
	return base, nil
}

// Model is one CPU model of libvirt's cpu_map: its vendor (none for some, such as qemu64) and
// its features, sorted.
type Model struct {
	Vendor   string   `json:"vendor,omitempty"`
	Features []string `json:"features"`
}

// Table is libvirt's cpu_map as the baseline decision reads it
// (data.virtrules.node.baseline.cpu_map): the libvirt version it came from and the models by
// arch ("x86_64"), then by model name.
type Table struct {
	Libvirt string                      `json:"libvirt"`
	Models  map[string]map[string]Model `json:"models"`
}

// Table is every x86_64 model libvirt knows, each expanded (Expand) with its vendor
// (ModelVendor): 58 models on libvirt 9.0, about 70 ms.
func (l *Libvirt) Table(ctx context.Context) (*Table, error) {
	version, err := l.Version()
	if err != nil {
		return nil, err
	}
	names, err := l.ModelNames(ctx, Arch)
	if err != nil {
		return nil, err
	}
	models := make(map[string]Model, len(names))
	for _, name := range names {
		vendor, features, err := l.Expand(ctx, CPU{Arch: Arch, Model: name})
		if err != nil {
			return nil, fmt.Errorf("cpumap: table: %w", err)
		}
		if features == nil {
			features = []string{}
		}
		models[name] = Model{Vendor: vendor, Features: features}
	}
	return &Table{Libvirt: version, Models: map[string]map[string]Model{Arch: models}}, nil
}

// Marshal is t as indented JSON (two spaces, one feature a line, keys sorted) with a trailing
// newline: the same table gives the same bytes, and a libvirt upgrade a diff of the lines it
// changes.
func (t *Table) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cpumap: marshal table: %w", err)
	}
	return append(b, '\n'), nil
}

// Unmarshal reads a table Marshal wrote.
func Unmarshal(b []byte) (*Table, error) {
	var t Table
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("cpumap: read table: %w", err)
	}
	return &t, nil
}

type featureXML struct {
	Policy string `xml:"policy,attr,omitempty"`
	Name   string `xml:"name,attr"`
}

type hostCPUXML struct {
	XMLName  xml.Name     `xml:"cpu"`
	Arch     string       `xml:"arch"`
	Model    string       `xml:"model"`
	Vendor   string       `xml:"vendor,omitempty"`
	Features []featureXML `xml:"feature"`
}

// hostXML is cpu's model, vendor and Require as a host CPU (Disable is left out: a host CPU's
// features are features it has).
func hostXML(cpu CPU) string {
	h := hostCPUXML{Arch: cpu.arch(), Model: cpu.Model, Vendor: cpu.Vendor}
	for _, f := range cpu.Require {
		h.Features = append(h.Features, featureXML{Name: f})
	}
	b, err := xml.Marshal(h)
	if err != nil {
		panic(err) // strings only: cannot fail
	}
	return string(b)
}

type guestCPUXML struct {
	Model    string       `xml:"model"`
	Vendor   string       `xml:"vendor"`
	Features []featureXML `xml:"feature"`
}

// parseCPU reads libvirt's answer, a guest <cpu>, sorting its features by policy.
func parseCPU(s, arch string) (CPU, error) {
	var g guestCPUXML
	if err := xml.Unmarshal([]byte(s), &g); err != nil {
		return CPU{}, fmt.Errorf("read libvirt's answer: %w", err)
	}
	cpu := CPU{Arch: arch, Model: g.Model, Vendor: g.Vendor}
	for _, f := range g.Features {
		switch f.Policy {
		case "require", "force", "":
			cpu.Require = append(cpu.Require, f.Name)
		case "disable", "forbid":
			cpu.Disable = append(cpu.Disable, f.Name)
		default:
			return CPU{}, fmt.Errorf("libvirt's answer has feature %s of policy %q", f.Name, f.Policy)
		}
	}
	sort.Strings(cpu.Require)
	sort.Strings(cpu.Disable)
	cpu.Require = slices.Compact(cpu.Require)
	cpu.Disable = slices.Compact(cpu.Disable)
	return cpu, nil
}

// without is the sorted set of features minus drop.
func without(features, drop []string) []string {
	out := make([]string, 0, len(features))
	for _, f := range features {
		if !slices.Contains(drop, f) {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}
