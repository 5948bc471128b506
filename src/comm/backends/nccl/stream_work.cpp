// The stream contract's ordering and lifetime logic (cuda_stream_work.h). Plain C++: every
// CUDA call goes through StreamOps, so this file builds and is tested without CUDA.
#include <lockstep/comm/cuda_stream_work.h>
#include <lockstep/error.h>

namespace lockstep::comm::cuda {

StreamWork::StreamWork(std::shared_ptr<StreamOps> ops, Stream caller_stream, Stream comm_stream,
                       std::vector<at::Tensor> tensors)
    : ops_(std::move(ops)), comm_(comm_stream), tensors_(std::move(tensors)) {
  LOCKSTEP_CHECK(ops_ != nullptr, "StreamWork needs StreamOps");
  ready_ = ops_->record(caller_stream);
  ops_->wait(comm_, ready_);
}

StreamWork::~StreamWork() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ready_) ops_->destroy(ready_);
  if (!done_) return;  // never enqueued: nothing on the stream uses the tensors
  if (finished_) {
    ops_->destroy(done_);
  } else {
    ops_->release_after(done_, std::move(tensors_));  // the stream may still use them
  }
}

void StreamWork::enqueue(const std::function<void()>& enqueue) {
  std::lock_guard<std::mutex> lock(mu_);
  LOCKSTEP_CHECK(done_ == nullptr, "StreamWork::enqueue called twice");
  try {
    enqueue();
  } catch (...) {
    error_ = std::current_exception();
  }
  done_ = ops_->record(comm_);
}

void StreamWork::rethrow_locked() const {
  if (error_) std::rethrow_exception(error_);
}

void StreamWork::release_locked() {
  finished_ = true;
  tensors_.clear();
}

void StreamWork::wait(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  LOCKSTEP_CHECK(done_ != nullptr, "StreamWork::wait before the op was enqueued");
  rethrow_locked();
  ops_->wait(stream ? stream : ops_->current_stream(), done_);
}

bool StreamWork::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_locked();
  if (!finished_ && done_ && ops_->query(done_)) release_locked();
  return finished_;
}

void StreamWork::synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  LOCKSTEP_CHECK(done_ != nullptr, "StreamWork::synchronize before the op was enqueued");
  rethrow_locked();
  if (!finished_) {
    ops_->synchronize(done_);
    release_locked();
  }
}

size_t StreamWork::tensors_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensors_.size();
}

}  // namespace lockstep::comm::cuda
