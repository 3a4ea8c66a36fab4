package pool

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// expectationTimeout bounds how long a pool waits for the cache to show its last pass: a
// watch event lost for good must not stop the pool forever.
const expectationTimeout = 30 * time.Second

// expectations remember, per pool, the VMs the last pass created and deleted until the cache
// shows them, so that no plan is made from a view that predates the previous pass (it would
// create again what exists, or pick names already taken). They live in memory: a new leader
// starts from a freshly synced cache.
type expectations struct {
	mu    sync.Mutex
	pools map[types.NamespacedName]*expectation
}

type expectation struct {
	created, deleted []string
	updated          map[string]string    // VM name -> template hash written
	restarted        map[string]types.UID // VM name -> UID of the VMI deleted
	deadline         time.Time
}

func (e *expectations) init() { e.pools = map[types.NamespacedName]*expectation{} }

func (e *expectations) expect(pool types.NamespacedName, x *expectation) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(x.created)+len(x.deleted)+len(x.updated)+len(x.restarted) == 0 {
		delete(e.pools, pool)
		return
	}
	x.deadline = time.Now().Add(expectationTimeout)
	e.pools[pool] = x
}

func (e *expectations) forget(pool types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pools, pool)
}

// met tells whether vms and vmis (the cache's view) show what the pool's last pass did: every
// VM it created, none it deleted (or only going ones), the template hash it wrote on the VMs
// it updated, and not the VMIs it deleted to restart.
func (e *expectations) met(pool types.NamespacedName, vms, vmis []*unstructured.Unstructured) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.pools[pool]
	if !ok {
		return true
	}
	live := make(map[string]bool, len(vms))
	hashes := make(map[string]string, len(vms))
	for _, vm := range vms {
		live[vm.GetName()] = vm.GetDeletionTimestamp() == nil
		hashes[vm.GetName()] = vm.GetAnnotations()[AnnotationTemplateHash]
	}
	vmiUIDs := make(map[string]types.UID, len(vmis))
	for _, vmi := range vmis {
		vmiUIDs[vmi.GetName()] = vmi.GetUID()
	}
	done := true
	for _, name := range x.created {
		if _, seen := live[name]; !seen {
			done = false
		}
	}
	for _, name := range x.deleted {
		if live[name] {
			done = false
		}
	}
	for name, hash := range x.updated {
		if live[name] && hashes[name] != hash {
			done = false
		}
	}
	for name, uid := range x.restarted {
		if vmiUIDs[name] == uid {
			done = false
		}
	}
	if done || time.Now().After(x.deadline) {
		delete(e.pools, pool)
		return true
	}
	return false
}
