package pool

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virt-rules/virt-rules/controllers/kinds"
)

func TestPoolNamesOfVM(t *testing.T) {
	vm := kinds.NewObject(GVKVirtualMachine)
	vm.SetName("web-front-3")
	if got, want := poolNamesOfVM(vm), []string{"web", "web-front"}; !slices.Equal(got, want) {
		t.Errorf("detached VM: %q, want %q", got, want)
	}
	yes := true
	vm.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "pool.virt-rules.io/v1alpha1", Kind: "VirtualMachinePool", Name: "web-front", UID: "u", Controller: &yes}})
	if got, want := poolNamesOfVM(vm), []string{"web-front", "web"}; !slices.Equal(got, want) {
		t.Errorf("owned VM: %q, want %q", got, want)
	}
	vm.SetName("plain")
	vm.SetOwnerReferences(nil)
	if got := poolNamesOfVM(vm); len(got) != 0 {
		t.Errorf("a VM no pool can name: %q, want none", got)
	}
}
