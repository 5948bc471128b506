// lockstep/compress/ddp_hook.h: QSGD as a DDP communication hook.
//
//   ddp.register_comm_hook(lockstep::compress::qsgd({.bits = 4, .bucket_size = 128}));
//
// The hook reads each GradBucket's per-parameter names, offsets and numels (never call
// order) to apply the per-layer policy and to keep buckets inside layers; it keeps one
// CompressedAllreduce plan (and its error-feedback residual) per bucket index, rebuilt
// when the bucket layout changes. LOCKSTEP_COMPRESSION_* variables override `options`
// (policy.h) unless options.use_env is false; bits = 32 makes it a plain allreduce.
//
// The buffer arrives divided by the world size, so the hook sums. The compressed
// allreduce needs the reduced sum between its two collectives, so the hook runs the
// whole exchange on the calling (autograd) thread and returns completed work: issuing the
// second collective later from another thread could interleave differently with the
// other buckets' collectives on different ranks. A NaN/Inf gradient is raised as
// NonFiniteGradient (naming the layer) from the result's finish step, on every rank.
#pragma once

#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/ddp/grad_bucket.h>

namespace lockstep::compress {

ddp::CommHook qsgd(QsgdOptions options = {});

}  // namespace lockstep::compress
