#include <lockstep/train/checkpoint_store.h>

#include <lockstep/error.h>
#include <lockstep/train/atomic_file.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

namespace fs = std::filesystem;

namespace lockstep::train {

CheckpointStore::CheckpointStore(std::string dir, comm::ProcessGroup* group, int64_t keep)
    : dir_(std::move(dir)), group_(group), keep_(keep), rank_(group ? group->rank() : 0) {}

std::string CheckpointStore::step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", (long long)step);
  return buf;
}

void CheckpointStore::barrier() const {
  if (group_ && group_->size() > 1) group_->barrier()->wait();
}

void CheckpointStore::save(int64_t step, const std::map<std::string, std::string>& shared,
                           const std::map<std::string, std::string>& per_rank) {
  const std::string final_dir = dir_ + "/" + step_name(step);
  const std::string tmp_dir = final_dir + ".tmp";
  if (rank_ == 0) {
    fs::create_directories(dir_);
    fs::remove_all(tmp_dir);  // leftovers of a crash during an earlier save of this step
    fs::create_directories(tmp_dir);
  }
  barrier();
  if (rank_ == 0)
    for (const auto& [name, bytes] : shared)
      write_file_atomic(detail::concat(tmp_dir, "/", name), bytes);
  for (const auto& [name, bytes] : per_rank)
    write_file_atomic(detail::concat(tmp_dir, "/", name), bytes);
  barrier();  // every rank's files are durable before the checkpoint becomes visible
  if (rank_ == 0) {
    fs::remove_all(final_dir);
    fs::rename(tmp_dir, final_dir);
    fsync_dir(dir_);
    write_file_atomic(dir_ + "/LATEST", step_name(step) + "\n");
    prune();
  }
  barrier();
}

std::optional<std::string> CheckpointStore::latest() const {
  const std::string p = dir_ + "/LATEST";
  if (!fs::exists(p)) return std::nullopt;
  std::string name = read_file(p);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string d = dir_ + "/" + name;
  if (!fs::is_directory(d)) throw Error(p + " names " + name + ", which does not exist");
  return d;
}

void CheckpointStore::prune() const {
  std::vector<std::string> done;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos)
      done.push_back(n);
  }
  std::sort(done.begin(), done.end());
  for (size_t i = 0; i + size_t(keep_) < done.size(); ++i) fs::remove_all(dir_ + "/" + done[i]);
}

}  // namespace lockstep::train
