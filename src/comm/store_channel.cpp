#include "comm/store_channel.h"

#include <algorithm>
#include <thread>

namespace lockstep::comm {

StoreChannel::StoreChannel(c10::intrusive_ptr<c10d::Store> store, std::string prefix)
    : store_(std::move(store)), prefix_(std::move(prefix)) {}

void StoreChannel::set(const std::string& key, const std::string& value) {
  store_->set(full(key), std::vector<uint8_t>(value.begin(), value.end()));
}

std::string StoreChannel::get(const std::string& key) {
  const std::vector<uint8_t> v = store_->get(full(key));
  return std::string(v.begin(), v.end());
}

std::optional<std::string> StoreChannel::get_if(const std::string& key) {
  if (!has(key)) return std::nullopt;
  return get(key);
}

bool StoreChannel::has(const std::string& key) { return store_->check({full(key)}); }

int64_t StoreChannel::add(const std::string& key, int64_t delta) {
  return store_->add(full(key), delta);
}

void StoreChannel::erase(const std::string& key) { store_->deleteKey(full(key)); }

bool StoreChannel::wait_for(const std::vector<std::string>& keys, Clock::time_point deadline,
                            const std::function<bool()>& stop) {
  std::vector<std::string> left;
  left.reserve(keys.size());
  for (const auto& k : keys) left.push_back(full(k));
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    // One check() per missing key: TCPStore's check of several keys says only "all or not".
    left.erase(std::remove_if(left.begin(), left.end(),
                              [&](const std::string& k) { return store_->check({k}); }),
               left.end());
    if (left.empty()) return true;
    if (Clock::now() >= deadline || (stop && stop())) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(250));
  }
}

}  // namespace lockstep::comm
