// The recorded random draws of checkpoints; see activation_checkpoint_draws.h.
#include "activation_checkpoint_draws.h"

#include <lockstep/error.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <mutex>

namespace lockstep::numerics::draws {
namespace {

struct Frame {
  KeptDraws* draws;
  DrawFrame::Mode mode;
};

std::vector<Frame>& frames() {
  thread_local std::vector<Frame> stack;
  return stack;
}

at::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The next recorded draw of a replaying frame, checked against the shape asked for.
const KeptDraw& take(KeptDraws& kept, c10::IntArrayRef sizes) {
  if (kept.next >= kept.draws.size())
    throw InvalidArgument(lockstep::detail::concat(
        "lockstep::numerics::activation_checkpoint: the recomputation made more kept random draws "
        "(dropout) than the "
        "forward (",
        kept.draws.size(),
        "); the checkpointed function must make the same dropout calls when run again"));
  const KeptDraw& d = kept.draws[kept.next];
  if (d.value.sizes() != sizes)
    throw InvalidArgument(lockstep::detail::concat(
        "lockstep::numerics::activation_checkpoint: kept random draw ", kept.next,
        " (dropout) has shape ", d.value.sizes(), " in the forward but ", sizes,
        " in the recomputation; the checkpointed function must make the "
        "same dropout calls on the same shapes when run again"));
  ++kept.next;
  return d;
}

}  // namespace

DrawFrame::DrawFrame(KeptDraws& draws, Mode mode) {
  if (mode == Mode::Replay) draws.next = 0;
  frames().push_back({&draws, mode});
}

DrawFrame::~DrawFrame() { frames().pop_back(); }

bool draw_frames_active() { return !frames().empty(); }

at::Tensor kept_draw(c10::IntArrayRef sizes, const std::function<at::Tensor()>& draw) {
  auto& stack = frames();
  size_t first_recording = 0;  // frames above the innermost replaying one record
  KeptDraw d;
  for (size_t i = stack.size(); i-- > 0;)
    if (stack[i].mode == DrawFrame::Mode::Replay) {
      d = take(*stack[i].draws, sizes);
      set_cpu_rng_state(d.rng_after);
      first_recording = i + 1;
      break;
    }
  if (!d.value.defined()) {
    d.value = draw();
    d.rng_after = cpu_rng_state();
  }
  for (size_t i = first_recording; i < stack.size(); ++i) stack[i].draws->draws.push_back(d);
  return d.value;
}

}  // namespace lockstep::numerics::draws
