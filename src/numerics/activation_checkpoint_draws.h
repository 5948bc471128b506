// src/numerics/activation_checkpoint_draws.h (internal): the random draws a checkpoint keeps from
// its forward for its recomputation, shared by checkpoint.cpp (which opens the frames) and
// dropout.cpp (which draws). See docs/memory.md, "Selective checkpointing".
//
// A checkpoint's forward opens a recording frame: every draw made through kept_draw() on
// this thread is appended to the checkpoint's list, with the CPU generator's state right
// after it. Its recomputation opens a replaying frame: kept_draw() hands the draws back in
// order and sets the generator to the recorded state, so the recomputation neither pays for
// the draw again nor shifts the RNG stream of later random ops in the block (which are
// still replayed from the forward's RNG state, as before).
//
// Frames nest: a checkpoint nested in another one records during the outer one's
// recomputation; its draws come from the innermost replaying frame below it and are
// recorded into every recording frame above that one. Thread-local, like grad mode.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace lockstep::numerics::draws {

// One draw: the value to keep (e.g. a bool mask) and the CPU generator state after it.
struct KeptDraw {
  at::Tensor value;
  at::Tensor rng_after;
};

// The draws of one checkpoint, in the order they were made.
struct KeptDraws {
  std::vector<KeptDraw> draws;
  size_t next = 0;  // replay cursor
};

// While alive, kept_draw() on this thread records into or replays from `draws`.
class DrawFrame {
 public:
  enum class Mode { Record, Replay };
  DrawFrame(KeptDraws& draws, Mode mode);
  ~DrawFrame();
  DrawFrame(const DrawFrame&) = delete;
  DrawFrame& operator=(const DrawFrame&) = delete;
};

// True when a frame is open on this thread (inside a checkpoint that keeps draws).
bool draw_frames_active();

// The value of one draw of shape `sizes`: `draw()` (which must consume the CPU generator
// only) recorded into the open recording frames, or the recorded value taken from the
// innermost replaying frame. Throws InvalidArgument when the replay does not match the
// recording (another shape, or more draws than the forward made).
at::Tensor kept_draw(c10::IntArrayRef sizes, const std::function<at::Tensor()>& draw);

}  // namespace lockstep::numerics::draws
