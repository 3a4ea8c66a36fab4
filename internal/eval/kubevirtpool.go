package eval

import (
	"context"
	"errors"
	"time"

	"github.com/virt-rules/virt-rules/engine"
)

// kubevirtPoolPreviews plans every pool.kubevirt.io VirtualMachinePool with the pool
// decision's kubevirt semantics: a preview of what KubeVirt's pool controller does next.
func (in *inputs) kubevirtPoolPreviews(ctx context.Context, eng *engine.Engine, now time.Time, opts Options, warn func(string)) ([]PoolResult, error) {
	if len(in.kubevirtPools) == 0 {
		return nil, nil
	}
	return nil, errors.New("pool.kubevirt.io pools: not implemented yet")
}
