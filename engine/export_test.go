package engine

import "context"

// PoolPlanParts is the engine's side of a pool plan in its parts, for
// BenchmarkPoolPlanParts: the input's conversion into AST values (every object converted, and
// with the engine's object cache, WithObjectCache), the evaluation of the converted input, and
// the decoding of the evaluated plan.
func (e *Engine) PoolPlanParts(ctx context.Context, in PoolInput) (convert, convertCached, eval, decode func() error, err error) {
	g := e.active.Load()
	input, err := poolInput(in, DefaultPoolBurstLimit, e.objects)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	t, err := g.eval(ctx, entryPoolPlan, input)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	convert = func() error { _, err := poolInput(in, DefaultPoolBurstLimit, nil); return err }
	convertCached = func() error { _, err := poolInput(in, DefaultPoolBurstLimit, e.objects); return err }
	eval = func() error { _, err := g.eval(ctx, entryPoolPlan, input); return err }
	decode = func() error { _, err := decodePoolPlan(t); return err }
	return convert, convertCached, eval, decode, nil
}

// DrainOneByOne is Drain asking about every node for every VMI, shapes aside: the reference
// the preview's placing of VMIs of one shape together must agree with.
func (e *Engine) DrainOneByOne(ctx context.Context, in DrainInput) (*DrainPreview, error) {
	return e.drain(ctx, in, true)
}
