package engine

import (
	"context"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// readPlan reads plans as the JSON round trip it replaces did, on plans the bundle makes of
// varied specs (valid, invalid, unsupported) and on hand-made values.
func TestReadPlanAgreesWithJSON(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	object := map[string]any{"kind": "VirtualMachine", "metadata": map[string]any{"name": "vm", "namespace": "demo"}}
	specs := map[string]string{
		"minimal": `{"domain": {"memory": {"guest": "64Mi"}, "devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
			"networks": [{"name": "default", "pod": {}}]}`,
		"every device": `{"domain": {"machine": {"type": "q35"}, "resources": {"requests": {"memory": "1Gi", "cpu": "3"}},
			"cpu": {"model": "Haswell"}, "clock": {"timezone": "Europe/Berlin"}, "firmware": {"uuid": "5d307ca9-b3ef-428c-8861-06e72d69f223"},
			"devices": {"autoattachMemBalloon": false, "rng": {},
				"disks": [{"name": "root", "disk": {"pciAddress": "0000:07:00.0"}, "bootOrder": 1, "serial": "s1"}, {"name": "ci", "cdrom": {}}, {"name": "db", "lun": {}}],
				"interfaces": [{"name": "default", "masquerade": {}, "model": "virtio", "macAddress": "02:00:00:00:00:09", "bootOrder": 2}, {"name": "x", "sriov": {}}],
				"inputs": [{"name": "t", "type": "tablet", "bus": "usb"}]}},
			"networks": [{"name": "default", "pod": {}}, {"name": "x", "multus": {"networkName": "x"}}],
			"volumes": [{"name": "root", "dataVolume": {"name": "r"}}, {"name": "ci", "cloudInitNoCloud": {}}, {"name": "db", "persistentVolumeClaim": {"claimName": "db"}}]}`,
		"invalid": `{"domain": {"machine": {"type": "nope"}, "cpu": {"cores": -1}, "devices": {"disks": [{"name": "x", "disk": {"bus": "ide"}}]}},
			"volumes": [{"name": "y", "hostPath": {}}]}`,
		"no devices": `{"domain": {"memory": {"guest": "1Gi"}}}`,
	}
	for name, doc := range specs {
		t.Run(name, func(t *testing.T) {
			var spec map[string]any
			if err := ast.As(ast.MustParseTerm(doc).Value, &spec); err != nil {
				t.Fatal(err)
			}
			p, err := e.PlanVMDefaults(ctx, object, spec, Machines{"amd64": {"pc", "q35"}})
			if err != nil {
				t.Fatal(err)
			}
			var want VMDefaultsPlan
			if err := decode(p.term, &want); err != nil {
				t.Fatal(err)
			}
			var got VMDefaultsPlan
			if err := readPlan(p.term, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("readPlan %+v\nJSON     %+v", got, want)
			}
		})
	}
	for _, bad := range []string{
		`[]`,
		`{"errors": "x"}`,
		`{"errors": [1]}`,
		`{"domain": {"memory_kib": -1}}`,
		`{"domain": {"vcpus": 1.5}}`,
		`{"domain": {"disks": [{"readonly": "yes"}]}}`,
		`{"domain": {"interfaces": [{"source": []}]}}`,
		`{"domain": {"clock": "utc"}}`,
	} {
		var want VMDefaultsPlan
		if decode(ast.MustParseTerm(bad), &want) == nil {
			t.Fatalf("%s: the JSON round trip takes it; the case proves nothing", bad)
		}
		if err := readPlan(ast.MustParseTerm(bad), &VMDefaultsPlan{}); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
