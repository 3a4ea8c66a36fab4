// Command genpolicies writes a manifest of n MigrationPolicies (with a Namespace and a few
// VMIs) to stdout, for timing `virt-rules eval` on large policy sets:
//
//	go run ./hack/genpolicies -n 10000 > /tmp/policies.yaml
//	time bin/virt-rules eval -o json /tmp/policies.yaml > /dev/null
//
// Every policy has its own selectors, so the set is valid, unless -duplicates k makes every
// k-th policy repeat the selectors of the one before it in the other shape ({matchLabels}
// versus a plain map), which the default bundle rejects.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
)

func main() {
	n := flag.Int("n", 1000, "number of MigrationPolicies")
	duplicates := flag.Int("duplicates", 0, "make every k-th policy a duplicate of the one before (0: none)")
	vmis := flag.Int("vmis", 10, "number of VirtualMachineInstances")
	flag.Parse()
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	fmt.Fprint(w, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: bench\n  labels:\n    tenant: tenant-0\n")
	for i := range *vmis {
		fmt.Fprintf(w, "---\napiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: vmi-%d\n  namespace: bench\n  labels:\n    app: app-%d\n    tier: web\n", i, i%max(1, *n))
	}
	for i := range *n {
		app, matchLabels := i, i%2 == 0
		if *duplicates > 0 && i > 0 && i%*duplicates == 0 {
			app, matchLabels = i-1, !((i-1)%2 == 0)
		}
		fmt.Fprintf(w, "---\napiVersion: migrations.kubevirt.io/v1alpha1\nkind: MigrationPolicy\nmetadata:\n  name: policy-%05d\nspec:\n  maxDowntimeMs: %d\n  selectors:\n", i, 100+i%900)
		if matchLabels {
			fmt.Fprintf(w, "    virtualMachineInstanceSelector:\n      matchLabels:\n        app: app-%d\n        tier: web\n", app)
		} else {
			fmt.Fprintf(w, "    virtualMachineInstanceSelector:\n      app: app-%d\n      tier: web\n", app)
		}
		if app%3 == 0 {
			fmt.Fprint(w, "    namespaceSelector:\n      tenant: tenant-0\n")
		}
	}
}
