//go:build libvirt

package defaults_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// objectOfShape is a VM or VMI of spec under an identity: a name, or a generateName (with
// the request creating it, or none).
func objectOfShape(kind, namespace, identity, spec string) []byte {
	specPath := "\n  template:\n    spec:"
	indent := "  "
	if kind == "VirtualMachineInstance" {
		specPath = ""
		indent = ""
	}
	// The shapes are indented for a VM's spec.template.spec.
	body := spec
	if indent == "" {
		body = strings.ReplaceAll(spec, "\n    ", "\n  ")
	}
	return vmJSON(fmt.Sprintf("apiVersion: kubevirt.io/v1\nkind: %s\nmetadata: {namespace: %s, %s}\nspec:%s%s\n", kind, namespace, identity, specPath, body))
}

// perObject gives spec's volumes and networks sources of the i-th object's own, as VMs of one
// template have: their own DataVolumes, claims, images, cloud-init data, Multus networks.
func perObject(spec string, i int) string {
	return sourceNames.ReplaceAllString(spec, fmt.Sprintf("${1}-%d${2}", i))
}

var sourceNames = regexp.MustCompile(`(dataVolume: \{name: r|claimName: d|claimName: db|image: x|networkName: n[0-9]|networkName: b|userData: "#cloud-config)("?\})`)

// bundleCopy writes the embedded bundle, without its tests, to a directory, with one text
// replaced in each file named (by its path in the bundle), and returns the directory.
func bundleCopy(edits map[string][2]string) string {
	GinkgoHelper()
	dir := clustersuite.ShippedBundleDir()
	for path, edit := range edits {
		file := filepath.Join(dir, path)
		raw, err := os.ReadFile(file)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(raw)).To(ContainSubstring(edit[0]))
		Expect(os.WriteFile(file, []byte(strings.Replace(string(raw), edit[0], edit[1], 1)), 0o644)).To(Succeed())
	}
	return dir
}

var _ = Describe("the shape cache", func() {
	var (
		cache *defaults.Cache
		kept  *defaults.ShapeCache
		// requests counts the shape cache's requests by result, as /metrics shows them.
		requests func(result string) float64
		cached   *defaults.Defaulter
		fresh    *defaults.Defaulter
	)
	BeforeEach(func() {
		var err error
		cache, err = defaults.NewCache(ctx, lv, 64, nil)
		Expect(err).NotTo(HaveOccurred())
		metrics := defaults.NewShapeCacheMetrics()
		registry := prometheus.NewRegistry()
		registry.MustRegister(metrics.Collectors()...)
		requests = func(result string) float64 {
			families, err := registry.Gather()
			Expect(err).NotTo(HaveOccurred())
			for _, f := range families {
				for _, m := range f.GetMetric() {
					if f.GetName() == "virtrules_defaults_shape_cache_requests_total" && m.GetLabel()[0].GetValue() == result {
						return m.GetCounter().GetValue()
					}
				}
			}
			return 0
		}
		kept, err = defaults.NewShapeCache(64, metrics)
		Expect(err).NotTo(HaveOccurred())
		cached = &defaults.Defaulter{Engine: defaulter.Engine, Hypervisor: cache, Shapes: kept}
		fresh = &defaults.Defaulter{Engine: defaulter.Engine, Hypervisor: lv}
	})

	It("answers objects of one template as full evaluation does, whatever their kind, namespace, name, generateName, request, volume and network sources", func() {
		identities := []struct{ namespace, identity, request string }{
			{"demo", "name: first", ""},
			{"demo", "name: second", ""},
			{"other", "name: first", ""},
			{"demo", "generateName: vm-", "uid-1"},
			{"demo", "generateName: vm-", "uid-2"},
			{"demo", "generateName: vm-", ""},
			{"prod", "generateName: web-", ""},
		}
		for shape, spec := range shapes {
			for _, kind := range []string{"VirtualMachine", "VirtualMachineInstance"} {
				By(shape + ", " + kind)
				for i, id := range identities {
					obj := objectOfShape(kind, id.namespace, id.identity, perObject(spec, i))
					got, err := cached.DefaultFor(ctx, obj, id.request)
					Expect(err).NotTo(HaveOccurred())
					want, err := fresh.DefaultFor(ctx, obj, id.request)
					Expect(err).NotTo(HaveOccurred())
					Expect(string(got.Object)).To(Equal(string(want.Object)), "%s %s", id.namespace, id.identity)
					Expect(got.Defaults).To(Equal(want.Defaults))
					Expect(got.Patch).To(Equal(want.Patch))
					raw, err := json.Marshal(got.Patch)
					Expect(err).NotTo(HaveOccurred())
					patch, err := jsonpatch.DecodePatch(raw)
					Expect(err).NotTo(HaveOccurred())
					patched, err := patch.Apply(obj)
					Expect(err).NotTo(HaveOccurred())
					Expect(patched).To(MatchJSON(got.Object), "the patch gives the defaulted object")
				}
			}
		}
		Expect(kept.Len()).To(Equal(2*len(shapes)), "one entry per template and kind")
		Expect(requests("miss")).To(Equal(float64(2 * len(shapes))))
		Expect(requests("hit")).To(Equal(float64(2 * len(shapes) * (len(identities) - 1))))
	})

	It("never shares a value between the objects it answers", func() {
		spec := shapes["i440fx, inputs, no balloon, an RNG, a clock"]
		a, err := cached.Default(ctx, objectOfShape("VirtualMachine", "demo", "name: a", spec))
		Expect(err).NotTo(HaveOccurred())
		b, err := cached.Default(ctx, objectOfShape("VirtualMachine", "demo", "name: b", spec))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(a.Object)).NotTo(Equal(string(b.Object)), "each its own MACs and UUID")
		again, err := cached.Default(ctx, objectOfShape("VirtualMachine", "demo", "name: a", spec))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(again.Object)).To(Equal(string(a.Object)))
	})

	It("still reports what is wrong with an object, and keeps no error", func() {
		bad := objectOfShape("VirtualMachine", "demo", "name: bad", `
      domain:
        machine: {type: no-such-machine}
        memory: {guest: 64Mi}`)
		for range 2 {
			_, err := cached.Default(ctx, bad)
			var invalid *defaults.InvalidError
			Expect(err).To(BeAssignableToTypeOf(invalid))
			Expect(err.Error()).To(ContainSubstring("spec.template.spec.domain.machine.type"))
		}
		Expect(kept.Len()).To(BeZero())

		// A shape seen before spares the rules, not the check of the object's types: the shape
		// leaves out what volumes point at, and that must be valid too.
		spec := shapes["q35 with disks on every bus"]
		_, err := cached.Default(ctx, objectOfShape("VirtualMachine", "demo", "name: good", spec))
		Expect(err).NotTo(HaveOccurred())
		for field, wrong := range map[string]struct{ identity, spec string }{
			"spec.template.spec.volumes.dataVolume.name": {"name: wrong", strings.Replace(spec, "dataVolume: {name: r}", "dataVolume: {name: 5}", 1)},
			"metadata.labels": {"name: wrong, labels: 5", spec},
		} {
			_, err = cached.Default(ctx, objectOfShape("VirtualMachine", "demo", wrong.identity, wrong.spec))
			var invalid *defaults.InvalidError
			Expect(errors.As(err, &invalid)).To(BeTrue(), "%s: %v", field, err)
			Expect(invalid.Causes[0].Field).To(HaveSuffix(field[strings.LastIndex(field, ".")+1:]))
		}
	})

	It("evaluates every object in full with a bundle that makes no identity promise", func() {
		dir := bundleCopy(map[string][2]string{"virtrules/vm/defaults/shape.rego": {"\nshape := ", "\nno_shape_promise := "}})
		eng, err := engine.New(ctx, engine.WithBundlePath(dir))
		Expect(err).NotTo(HaveOccurred())
		_, err = eng.VMShape(ctx, map[string]any{}, map[string]any{}, "")
		Expect(err).To(MatchError(engine.ErrMissingDecision))

		custom := &defaults.Defaulter{Engine: eng, Hypervisor: cache, Shapes: kept}
		spec := shapes["minimal, on KubeVirt's default q35"]
		for _, name := range []string{"a", "b"} {
			obj := objectOfShape("VirtualMachine", "demo", "name: "+name, spec)
			got, err := custom.Default(ctx, obj)
			Expect(err).NotTo(HaveOccurred())
			want, err := fresh.Default(ctx, obj)
			Expect(err).NotTo(HaveOccurred())
			Expect(string(got.Object)).To(Equal(string(want.Object)))
		}
		Expect(kept.Len()).To(BeZero(), "nothing kept without the promise")
		Expect(requests("bypass")).To(Equal(2.0))
	})

	It("answers with the bundle being served, never with what an earlier one answered", func() {
		eng, err := engine.New(ctx, engine.WithBundlePath(bundleCopy(nil)))
		Expect(err).NotTo(HaveOccurred())
		d := &defaults.Defaulter{Engine: eng, Hypervisor: cache, Shapes: kept}
		spec := shapes["q35 with disks on every bus"]
		for _, name := range []string{"a", "b"} {
			res, err := d.Default(ctx, objectOfShape("VirtualMachine", "demo", "name: "+name, spec))
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Defaults).To(ContainElement("spec.template.spec.domain.devices.autoattachMemBalloon"))
		}
		Expect(requests("hit")).To(Equal(1.0))

		// The same revision twice would do too: every activation is a generation of its own.
		Expect(eng.LoadPath(ctx, bundleCopy(map[string][2]string{"virtrules/vm/defaults/mapping.rego": {
			`_candidates contains [["domain", "devices", "autoattachMemBalloon"], true]`,
			`_no_candidates contains [["domain", "devices", "autoattachMemBalloon"], true]`,
		}}))).To(Succeed())
		res, err := d.Default(ctx, objectOfShape("VirtualMachine", "demo", "name: c", spec))
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Defaults).NotTo(ContainElement("spec.template.spec.domain.devices.autoattachMemBalloon"))
		Expect(requests("hit")).To(Equal(1.0), "a new bundle, a new shape")
	})
})
