#include <lockstep/train/checkpoint_store.h>

#include <lockstep/train/atomic_file.h>

#include "train/checkpoint/crc32.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace lockstep::train {
namespace {

constexpr const char* kMeta = "meta.json";
constexpr int kFormatVersion = 2;  // 1: no "files" table, no "meta_crc32"

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::optional<uint32_t> parse_hex32(const std::string& s) {
  if (s.empty() || s.size() > 8 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    return std::nullopt;
  return uint32_t(std::stoul(s, nullptr, 16));
}

// The checksum meta.json carries of itself: over its 2-space dump without "meta_crc32".
// nlohmann's dump is canonical (sorted keys, shortest round-trip numbers), so a reader
// that parses and dumps again gets the same bytes.
uint32_t meta_self_crc(json meta) {
  meta.erase("meta_crc32");
  return checkpoint_crc32(meta.dump(2));
}

// "name\tcrc\tbytes\n" per file: this rank's part of the files table.
std::string manifest_lines(const std::map<std::string, std::string>& files) {
  std::string out;
  for (const auto& [name, bytes] : files)
    out += CheckpointStore::manifest_line(name, checkpoint_crc32(bytes), int64_t(bytes.size()));
  return out;
}

json files_table(const std::string& manifest) {
  json files = json::object();
  std::istringstream in(manifest);
  std::string name, crc;
  int64_t bytes = 0;
  while (std::getline(in, name, '\t') && std::getline(in, crc, '\t') && in >> bytes) {
    in.ignore(1);  // '\n'
    files[name] = {{"crc32", crc}, {"bytes", bytes}};
  }
  return files;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

uint32_t checkpoint_crc32(const std::string& bytes) {
  return crc32_update(0, bytes.data(), bytes.size());
}

// ---------------------------------------------------------------------------------------
// Reading

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string p = path(kMeta);
  if (!fs::is_regular_file(p)) throw CheckpointError(p + ": missing");
  meta_text_ = read_file(p);
  json meta;
  try {
    meta = json::parse(meta_text_);
  } catch (const json::exception& e) {
    throw CheckpointError(p + ": damaged: not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!meta.is_object() || meta.value("format", std::string()) != "lockstep-checkpoint")
    throw CheckpointError(p + ": damaged: not a lockstep checkpoint's meta.json");
  if (!meta.contains("meta_crc32")) return;  // format version 1: unverified
  const auto want = parse_hex32(
      meta["meta_crc32"].is_string() ? meta["meta_crc32"].get<std::string>() : std::string());
  const uint32_t found = meta_self_crc(meta);
  if (!want || *want != found)
    throw CheckpointError(p + ": damaged: expected crc32 " + meta["meta_crc32"].dump() +
                          ", found \"" + hex32(found) + "\"");
  verified_ = true;
  for (const auto& [name, d] : meta.at("files").items()) {
    const auto crc = parse_hex32(d.at("crc32").get<std::string>());
    if (!crc) throw CheckpointError(lockstep::detail::concat(p, ": damaged: bad crc32 of ", name));
    files_[name] = Digest{*crc, d.at("bytes").get<int64_t>()};
  }
}

std::string CheckpointReader::read(const std::string& name) const {
  const std::string p = path(name);
  const auto it = files_.find(name);
  if (verified_ && it == files_.end())
    throw CheckpointError(p + ": not recorded in meta.json's files (of another checkpoint?)");
  if (!fs::is_regular_file(p)) {
    if (!verified_) throw CheckpointError(p + ": missing");
    throw CheckpointError(p + ": missing (meta.json records " + std::to_string(it->second.bytes) +
                          " bytes, crc32 " + hex32(it->second.crc32) + ")");
  }
  std::string bytes = read_file(p);
  if (!verified_) return bytes;
  const Digest& want = it->second;
  const uint32_t crc = checkpoint_crc32(bytes);
  if (int64_t(bytes.size()) != want.bytes)
    throw CheckpointError(p + ": truncated or damaged: expected " + std::to_string(want.bytes) +
                          " bytes with crc32 " + hex32(want.crc32) + ", found " +
                          std::to_string(bytes.size()) + " bytes with crc32 " + hex32(crc));
  if (crc != want.crc32)
    throw CheckpointError(p + ": damaged: expected crc32 " + hex32(want.crc32) + ", found " +
                          hex32(crc) + " (" + std::to_string(bytes.size()) + " bytes)");
  return bytes;
}

// ---------------------------------------------------------------------------------------
// Writing

CheckpointStore::CheckpointStore(std::string dir, comm::ProcessGroup* group, int64_t keep)
    : dir_(std::move(dir)), group_(group), keep_(keep), rank_(group ? group->rank() : 0) {}

std::string CheckpointStore::step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", (long long)step);
  return buf;
}

std::optional<int64_t> CheckpointStore::parse_step_name(const std::string& name) {
  if (name.size() < 13 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(digits);
}

void CheckpointStore::barrier() const {
  if (group_ && group_->size() > 1) group_->barrier()->wait();
}

// Every rank's manifest lines, concatenated in rank order (on every rank): one allreduce of
// the longest length, one allgather of the padded texts.
std::string CheckpointStore::gather_manifest(const std::string& mine) const {
  if (!group_ || group_->size() == 1) return mine;
  auto len = torch::tensor({int64_t(mine.size())}, torch::kInt64);
  group_->allreduce(len, {comm::ReduceOp::Max})->wait();
  const int64_t n = std::max<int64_t>(len.item<int64_t>(), 1);
  auto in = torch::zeros({n}, torch::kUInt8);
  std::copy(mine.begin(), mine.end(), in.data_ptr<uint8_t>());
  auto out = torch::empty({n * group_->size()}, torch::kUInt8);
  group_->allgather(out, in)->wait();
  std::string all;
  for (int r = 0; r < group_->size(); ++r) {
    const char* p = reinterpret_cast<const char*>(out.data_ptr<uint8_t>()) + r * n;
    all.append(p, strnlen(p, size_t(n)));
  }
  return all;
}

std::string CheckpointStore::manifest_line(const std::string& name, uint32_t crc32, int64_t bytes) {
  return name + "\t" + hex32(crc32) + "\t" + std::to_string(bytes) + "\n";
}

void CheckpointStore::prepare(int64_t step) const {
  if (rank_ == 0) {
    const std::string tmp = tmp_dir(step);
    fs::create_directories(dir_);
    fs::remove_all(tmp);  // leftovers of a crash during an earlier save of this step
    fs::create_directories(tmp);
  }
  barrier();
}

void CheckpointStore::remove_leftovers() const {
  if (!fs::is_directory(dir_)) return;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
        parse_step_name(name.substr(0, name.size() - 4)))
      stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove_all(p);
}

void CheckpointStore::commit(int64_t step, const std::string& meta_json,
                             const std::string& manifest,
                             const std::function<void(const char*)>& at) const {
  const std::string final_dir = dir_ + "/" + step_name(step);
  const std::string tmp = tmp_dir(step);
  json meta = json::parse(meta_json);
  meta["version"] = kFormatVersion;
  meta["files"] = files_table(manifest);
  meta["meta_crc32"] = hex32(meta_self_crc(meta));
  write_file_atomic(tmp + "/" + kMeta, meta.dump(2));
  if (at) at("commit-rename");
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_dir(dir_);
  if (at) at("commit-latest");
  write_file_atomic(dir_ + "/LATEST", step_name(step) + "\n");
  prune(step);
}

void CheckpointStore::save(int64_t step, const std::string& meta_json,
                           const std::map<std::string, std::string>& shared,
                           const std::map<std::string, std::string>& per_rank) {
  const std::string tmp = tmp_dir(step);
  const std::string manifest = gather_manifest(
      rank_ == 0 ? manifest_lines(shared) + manifest_lines(per_rank) : manifest_lines(per_rank));
  prepare(step);
  if (rank_ == 0)
    for (const auto& [name, bytes] : shared)
      write_file_atomic(lockstep::detail::concat(tmp, "/", name), bytes);
  for (const auto& [name, bytes] : per_rank)
    write_file_atomic(lockstep::detail::concat(tmp, "/", name), bytes);
  barrier();  // every rank's files are durable before the checkpoint becomes visible
  if (rank_ == 0) commit(step, meta_json, manifest);
  barrier();
}

// ---------------------------------------------------------------------------------------
// Finding

std::optional<std::string> CheckpointStore::latest() const {
  const std::string p = dir_ + "/LATEST";
  if (!fs::exists(p)) return std::nullopt;
  const std::string name = trimmed(read_file(p));
  const std::string d = dir_ + "/" + name;
  if (!parse_step_name(name) || !fs::is_directory(d))
    throw CheckpointError(p + " names '" + name + "', which is no checkpoint directory");
  return d;
}

std::vector<int64_t> CheckpointStore::complete_steps() const {
  std::vector<int64_t> steps;
  if (!fs::is_directory(dir_)) return steps;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.is_directory())
      if (auto s = parse_step_name(e.path().filename().string())) steps.push_back(*s);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::vector<std::string> CheckpointStore::candidates(std::string* note) const {
  std::optional<int64_t> newest;
  try {
    if (auto d = latest()) newest = parse_step_name(fs::path(*d).filename().string());
  } catch (const CheckpointError& e) {
    if (note) *note = std::string(e.what()) + "; trying every checkpoint, newest first";
  }
  std::vector<std::string> out;
  for (int64_t s : complete_steps())
    if (!newest || s <= *newest) out.push_back(dir_ + "/" + step_name(s));
  return out;
}

// Keeps the checkpoint just saved and the newest keep-1 older ones. Later steps than the
// one saved belong to another run in the same directory (LATEST no longer names them):
// they are left alone, as is anything that is not a complete checkpoint.
void CheckpointStore::prune(int64_t saved_step) const {
  int64_t kept = 1;
  for (int64_t s : complete_steps()) {
    if (s >= saved_step) continue;
    if (kept < keep_) {
      ++kept;
      continue;
    }
    fs::remove_all(dir_ + "/" + step_name(s));
  }
}

}  // namespace lockstep::train
