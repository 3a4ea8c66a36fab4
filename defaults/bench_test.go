//go:build libvirt

package defaults_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
)

// One embedded libvirt per process: every benchmark shares it.
var (
	benchOnce sync.Once
	benchRoot string
	benchLV   *defaults.Libvirt
	benchEng  *engine.Engine
	benchErr  error
)

// TestMain removes the benchmarks' libvirt root when they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	if benchLV != nil {
		benchLV.Close()
	}
	if benchRoot != "" {
		os.RemoveAll(benchRoot)
	}
	os.Exit(code)
}

func setup(b testing.TB) (*defaults.Libvirt, *engine.Engine) {
	b.Helper()
	benchOnce.Do(func() {
		root, err := os.MkdirTemp("/dev/shm", "virt-rules-bench-")
		if err != nil {
			benchErr = err
			return
		}
		benchRoot = root
		ctx := context.Background()
		if benchEng, benchErr = engine.New(ctx); benchErr != nil {
			return
		}
		benchLV, benchErr = defaults.OpenLibvirt(ctx, root, nil)
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchLV, benchEng
}

const benchVM = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: testvm, namespace: demo}
spec:
  template:
    spec:
      domain:
        machine: {type: q35}
        memory: {guest: 1Gi}
        devices:
          disks: [{name: root, disk: {}}, {name: cloudinit, cdrom: {}}]
          interfaces: [{name: default, masquerade: {}}]
      networks: [{name: default, pod: {}}]
      volumes:
      - {name: root, dataVolume: {name: root}}
      - {name: cloudinit, cloudInitNoCloud: {userData: "#cloud-config"}}
`

// reportLatency adds p50 and p99 in milliseconds and requests per second.
func reportLatency(b *testing.B, lat []time.Duration, elapsed time.Duration) {
	slices.Sort(lat)
	if len(lat) == 0 {
		return
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
}

// BenchmarkLibvirtDefineUndefine is libvirt alone on a small q35 domain (2 disks, 1 NIC):
// defined, read back and undefined, with no rules and no HTTP. BenchmarkNewShape/floor is the
// same for the domain KubeVirt would define.
func BenchmarkLibvirtDefineUndefine(b *testing.B) {
	lv, _ := setup(b)
	dom := &libvirtxml.Domain{}
	if err := dom.Unmarshal(`<domain type="qemu"><memory unit="KiB">1048576</memory><vcpu>1</vcpu><os><type machine="q35">hvm</type></os>
<devices><disk type="file" device="disk"><source file="/virt-rules-dummy/volumes/root"/><target dev="vda" bus="virtio"/></disk>
<disk type="file" device="cdrom"><source file="/virt-rules-dummy/volumes/cloudinit"/><target dev="sda" bus="sata"/><readonly/></disk>
<interface type="ethernet"><mac address="02:00:00:00:00:01"/></interface></devices></domain>`); err != nil {
		b.Fatal(err)
	}
	benchFloor(b, lv, dom)
}

// captured remembers the first domain asked of it.
type captured struct {
	defaults.Hypervisor
	domain *libvirtxml.Domain
}

func (c *captured) DefineAndRead(ctx context.Context, d *libvirtxml.Domain) ([]byte, error) {
	if c.domain == nil {
		c.domain = d
	}
	return c.Hypervisor.DefineAndRead(ctx, d)
}

// BenchmarkNewShape is a VM of a shape never seen, defaulted in process with no cache ("rego":
// the rules, the domain XML, libvirt, the mapping back) against its floor in the same run:
// libvirt defining, reading back and undefining the very domain the rules planned for it
// ("floor"). make bench prints the ratio.
func BenchmarkNewShape(b *testing.B) {
	lv, eng := setup(b)
	first := &captured{Hypervisor: lv}
	if _, err := (&defaults.Defaulter{Engine: eng, Hypervisor: first}).Default(context.Background(), templateVM(b, 0)); err != nil {
		b.Fatal(err)
	}
	b.Run("rego", func(b *testing.B) {
		// One template: every VM its own name, volumes and data.
		benchDefault(b, &defaults.Defaulter{Engine: eng, Hypervisor: lv}, func(i int) int { return 4 * i })
	})
	b.Run("floor", func(b *testing.B) { benchFloor(b, lv, first.domain) })
}

// BenchmarkNewShapeInstancetype is BenchmarkNewShape for a VM of an instancetype and a
// preference (examples/defaults' u1.medium and fedora shapes): the rules expand them first, and
// such a VM has no shape, so every one is evaluated in full ("rego"), against libvirt
// defining, reading back and undefining the domain planned for it ("floor").
func BenchmarkNewShapeInstancetype(b *testing.B) {
	lv, eng := setup(b)
	refs := defaults.Objects{}
	for _, doc := range []string{
		`{"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachineClusterInstancetype", "metadata": {"name": "u1.medium"}, "spec": {"cpu": {"guest": 1}, "memory": {"guest": "4Gi"}}}`,
		`{"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachineClusterPreference", "metadata": {"name": "fedora"},
		  "spec": {"devices": {"preferredDiskBus": "virtio", "preferredInterfaceModel": "virtio", "preferredNetworkInterfaceMultiQueue": true, "preferredRng": {}},
		           "features": {"preferredSmm": {}}, "firmware": {"preferredEfi": {"secureBoot": true}}, "preferredArchitecture": "amd64"}}`,
	} {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			b.Fatal(err)
		}
		refs.Add(obj)
	}
	vm := func(i int) []byte {
		j, err := yaml.YAMLToJSON(fmt.Appendf(nil, `apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm-%d, namespace: demo}
spec:
  instancetype: {name: u1.medium}
  preference: {name: fedora}
  template:
    spec:
      domain: {devices: {disks: [{name: root}, {name: cloudinit}]}}
      volumes:
      - {name: root, dataVolume: {name: vm-%d-root}}
      - {name: cloudinit, cloudInitNoCloud: {userData: "#cloud-config\nhostname: vm-%d"}}
`, i, i, i))
		if err != nil {
			b.Fatal(err)
		}
		return j
	}
	first := &captured{Hypervisor: lv}
	if _, err := (&defaults.Defaulter{Engine: eng, Hypervisor: first, Finder: refs}).Default(context.Background(), vm(0)); err != nil {
		b.Fatal(err)
	}
	b.Run("rego", func(b *testing.B) {
		d := &defaults.Defaulter{Engine: eng, Hypervisor: lv, Finder: refs}
		lat := make([]time.Duration, 0, b.N)
		vms := make([][]byte, b.N)
		for i := range vms {
			vms[i] = vm(i + 1)
		}
		b.ResetTimer()
		start := time.Now()
		for i := range b.N {
			t := time.Now()
			if _, err := d.Default(context.Background(), vms[i]); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t))
		}
		reportLatency(b, lat, time.Since(start))
	})
	b.Run("floor", func(b *testing.B) { benchFloor(b, lv, first.domain) })
}

// benchFloor is libvirt alone defining, reading back and undefining dom, b.N times.
func benchFloor(b *testing.B, lv *defaults.Libvirt, dom *libvirtxml.Domain) {
	lat := make([]time.Duration, 0, b.N)
	start := time.Now()
	for b.Loop() {
		t := time.Now()
		if _, err := lv.DefineAndRead(context.Background(), dom); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	reportLatency(b, lat, time.Since(start))
}

// BenchmarkDefault is one VM defaulted in-process: rules, XML, libvirt ("uncached"); the
// template mix of BenchmarkService with libvirt's answers cached ("templates"); and that mix
// with the shape cache too ("shapes"), as the service runs.
func BenchmarkDefault(b *testing.B) {
	lv, eng := setup(b)
	cache, err := defaults.NewCache(context.Background(), lv, defaults.DefaultCacheSize, nil)
	if err != nil {
		b.Fatal(err)
	}
	shapes, err := defaults.NewShapeCache(defaults.DefaultCacheSize, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, mix := range []struct {
		name   string
		hv     defaults.Hypervisor
		shapes *defaults.ShapeCache
	}{{"uncached", lv, nil}, {"templates", cache, nil}, {"shapes", cache, shapes}} {
		b.Run(mix.name, func(b *testing.B) {
			benchDefault(b, &defaults.Defaulter{Engine: eng, Hypervisor: mix.hv, Shapes: mix.shapes}, func(i int) int { return i })
		})
	}
}

// benchDefault defaults b.N VMs with d, the i-th templateVM(vm(i)), and reports latencies.
func benchDefault(b *testing.B, d *defaults.Defaulter, vm func(i int) int) {
	vms := make([][]byte, b.N)
	for i := range vms {
		vms[i] = templateVM(b, vm(i))
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		t := time.Now()
		if _, err := d.Default(context.Background(), vms[i]); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	reportLatency(b, lat, time.Since(start))
}

// templateVM is the n-th VM of the bench's mix: VMs of a few templates (shapes), each VM with
// a name (so MACs and firmware UUID), a DataVolume and cloud-init data of its own, as VMs
// created from templates are.
func templateVM(b *testing.B, n int) []byte {
	shapes := []string{
		"", // benchVM as it is
		strings.Replace(benchVM, "machine: {type: q35}", "machine: {type: pc}", 1),
		strings.Replace(benchVM, "memory: {guest: 1Gi}", "memory: {guest: 2Gi}", 1),
		strings.Replace(benchVM, "interfaces: [{name: default, masquerade: {}}]", "interfaces: [{name: default, masquerade: {}, model: virtio}]", 1),
	}
	doc := shapes[n%len(shapes)]
	if doc == "" {
		doc = benchVM
	}
	// Each VM its own name, DataVolume and cloud-init data, as VMs of one template have.
	doc = strings.Replace(doc, "name: testvm", fmt.Sprintf("name: vm-%d", n), 1)
	doc = strings.Replace(doc, "dataVolume: {name: root}", fmt.Sprintf("dataVolume: {name: vm-%d-root}", n), 1)
	doc = strings.Replace(doc, `userData: "#cloud-config"`, fmt.Sprintf(`userData: "#cloud-config\nhostname: vm-%d"`, n), 1)
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		b.Fatal(err)
	}
	return j
}

// BenchmarkService is the HTTP service with 1 and 4 concurrent clients: "uncached" asks
// libvirt for every VM (the cold path: a VM of a shape not seen yet, every time); "templates"
// is the common case, VMs of 4 templates each with a name (so MACs and UUID) of its own, where
// libvirt is asked once per template and the answer cache serves the rest: its p50 is the
// cache-hit path (the shape cache's, on top of libvirt's answers cached), "uncached" the
// cache-miss path.
func BenchmarkService(b *testing.B) {
	lv, eng := setup(b)
	for _, mix := range []struct {
		name      string
		cacheSize int
	}{{"uncached", 0}, {"templates", defaults.DefaultCacheSize}} {
		svc := defaults.NewService(eng, nil, defaults.WithCacheSize(mix.cacheSize))
		svc.SetHypervisor(lv)
		srv := httptest.NewServer(svc)
		url := srv.URL + defaults.Path + "?dryRun=true"
		for _, clients := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/clients=%d", mix.name, clients), func(b *testing.B) {
				vms := make([][]byte, b.N)
				for i := range vms {
					vms[i] = templateVM(b, i)
				}
				// Exactly `clients` goroutines share b.N requests, each with its own connection.
				var mu sync.Mutex
				var wg sync.WaitGroup
				lat := make([]time.Duration, 0, b.N)
				work := make(chan []byte, b.N)
				for _, vm := range vms {
					work <- vm
				}
				close(work)
				b.ResetTimer()
				start := time.Now()
				for range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
						var mine []time.Duration
						for vm := range work {
							t := time.Now()
							resp, err := client.Post(url, "application/json", bytes.NewReader(vm))
							if err != nil {
								b.Error(err)
								return
							}
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode != http.StatusOK {
								b.Errorf("status %d", resp.StatusCode)
								return
							}
							mine = append(mine, time.Since(t))
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					}()
				}
				wg.Wait()
				reportLatency(b, lat, time.Since(start))
			})
		}
		srv.Close()
	}
}
