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
	deadline         time.Time
}

func (e *expectations) init() { e.pools = map[types.NamespacedName]*expectation{} }

func (e *expectations) expect(pool types.NamespacedName, created, deleted []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(created)+len(deleted) == 0 {
		delete(e.pools, pool)
		return
	}
	e.pools[pool] = &expectation{created: created, deleted: deleted, deadline: time.Now().Add(expectationTimeout)}
}

func (e *expectations) forget(pool types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pools, pool)
}

// met tells whether vms (the cache's view) show every VM the pool's last pass created and
// none it deleted (or only going ones).
func (e *expectations) met(pool types.NamespacedName, vms []*unstructured.Unstructured) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.pools[pool]
	if !ok {
		return true
	}
	live := make(map[string]bool, len(vms))
	for _, vm := range vms {
		live[vm.GetName()] = vm.GetDeletionTimestamp() == nil
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
	if done || time.Now().After(x.deadline) {
		delete(e.pools, pool)
		return true
	}
	return false
}
