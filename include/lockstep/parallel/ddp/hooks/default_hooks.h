// lockstep/parallel/ddp/hooks/default_hooks.h: built-in communication hooks.
//
// All keep the GradBucket contract: the buffer arrives divided by world_size and
// holds the average once the hook's work and finish step are done.
#pragma once

#include <lockstep/parallel/ddp/grad_bucket.h>

namespace lockstep::ddp::hooks {

// Plain in-place sum-allreduce of the bucket. Payload = buffer bytes. What DDP does
// without a hook, except that the default reduces param.grad in place (no copy into
// the bucket and back); registering this hook forces the copy path.
CommHook allreduce_hook();

// Cast the bucket to bfloat16 / float16, sum-allreduce in low precision, cast back
// into the buffer. Halves the payload of float32 buckets. The division by the
// world size happened before the cast (fused into the gradient copy), which keeps
// fp16 sums away from overflow. Buckets that are not float32/float64 are reduced
// as they are. The low-precision staging tensors are allocated once per bucket
// and reused.
CommHook bf16_compress_hook();
CommHook fp16_compress_hook();

}  // namespace lockstep::ddp::hooks
