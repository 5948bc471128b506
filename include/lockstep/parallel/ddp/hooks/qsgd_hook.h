// lockstep/parallel/ddp/hooks/qsgd_hook.h: QSGD as a DDP communication hook.
//
//   lockstep::compress::QsgdOptions o;   // 4 bits, buckets of 128 values by default
//   ddp.register_comm_hook(lockstep::ddp::hooks::qsgd(o));
//
// The hook reads each GradBucket's per-parameter names, offsets and numels (never call
// order) to apply the per-layer policy and to keep buckets inside layers; it keeps one
// CompressedAllreduce plan (and its error-feedback residual) per bucket index, rebuilt
// when the bucket layout changes. LOCKSTEP_COMPRESSION_* variables override `options`
// (policy.h) unless options.use_env is false; bits = 32 makes it a plain allreduce.
//
// The buffer arrives divided by the world size, so the hook sums. The whole exchange
// (alltoall, owner sum, re-encode, allgather) is queued as ONE composite operation on the
// group's comm thread (ProcessGroup::run_composite), so backward goes on while it runs
// and its steps keep the same order on every rank. A NaN/Inf gradient is raised as
// NonFiniteGradient (naming the layer) from the result's finish step, on every rank.
#pragma once

#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/parallel/ddp/grad_bucket.h>

namespace lockstep::ddp::hooks {

CommHook qsgd(compress::QsgdOptions options = {});

}  // namespace lockstep::ddp::hooks
