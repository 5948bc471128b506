// lockstep/parallel/ddp/grad_bucket.h: what a communication hook receives and returns.
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/comm/work.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::ddp {

// One gradient bucket, as handed to a communication hook.
//
// `buffer` is a flat, contiguous 1-D tensor (one dtype) that holds this rank's
// gradients of the bucket's parameters ALREADY DIVIDED BY world_size (the
// division is fused into the copy from param.grad). A hook must leave in `buffer`
// the sum over ranks of their buffers, i.e. the averaged gradient, once its work
// and its `finish` step are done. Parameter i of the bucket occupies
// buffer[offsets[i], offsets[i] + numels[i]) with shape shapes[i].
//
// The per-parameter metadata (names in particular) travels with the bucket so a
// hook never has to infer which parameters it sees from call order: the layout
// changes when buckets are rebuilt after the first iteration.
//
// Lifetime: the GradBucket object and its vectors live as long as the bucket
// layout (until a rebuild); a hook may keep per-bucket state keyed by `index`.
struct GradBucket {
  int64_t index = 0;  // 0..num_buckets-1, the launch order (same on every rank)
  int64_t num_buckets = 0;
  bool is_last = false;  // the last bucket of the step
  int world_size = 1;
  at::Tensor buffer;
  std::vector<std::string> names;
  std::vector<int64_t> offsets;
  std::vector<int64_t> numels;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> param_indices;  // indices into the reducer's parameter list
};

// What a hook returns: the work that reduces the bucket, an optional step run
// on the waiting thread after work->wait() (e.g. decode into `buffer`), and the
// payload bytes this rank contributed (for the statistics).
struct HookResult {
  comm::WorkPtr work;
  std::function<void()> finish;
  int64_t bytes = 0;
};

// A communication hook. Called from the autograd thread, in bucket index order,
// once per bucket per synchronized backward; it must issue its collectives on
// `group` right away (all ranks issue the same sequence) and not block on them.
using CommHook = std::function<HookResult(comm::ProcessGroup& group, const GradBucket& bucket)>;

}  // namespace lockstep::ddp
