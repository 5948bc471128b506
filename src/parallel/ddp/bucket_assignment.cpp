// Greedy bucket assignment in expected-readiness order; see bucket_assignment.h.
#include <lockstep/error.h>
#include <lockstep/parallel/ddp/bucket_assignment.h>

#include <algorithm>
#include <map>

namespace lockstep::ddp {

std::vector<BucketSpec> compute_bucket_assignment(const std::vector<int64_t>& numels,
                                                  const std::vector<at::ScalarType>& dtypes,
                                                  const std::vector<int64_t>& order,
                                                  int64_t first_bucket_bytes,
                                                  int64_t bucket_cap_bytes) {
  const size_t n = numels.size();
  LOCKSTEP_CHECK_EQ(dtypes.size(), n);
  LOCKSTEP_CHECK_EQ(order.size(), n, "bucket order must list every parameter once");
  std::vector<char> seen(n, 0);
  for (int64_t p : order) {
    LOCKSTEP_CHECK(p >= 0 && p < (int64_t)n && !seen[p], "bucket order is not a permutation (", p,
                   ")");
    seen[p] = 1;
  }

  struct Open {
    BucketSpec spec;
    int64_t first_pos = 0;  // position in `order` of its first parameter
    int closed_so_far = 0;  // buckets of this dtype already closed
  };
  std::map<at::ScalarType, Open> open;  // keyed by dtype: deterministic iteration
  std::vector<std::pair<int64_t, BucketSpec>> done;
  for (size_t pos = 0; pos < n; ++pos) {
    const int64_t p = order[pos];
    auto& o = open[dtypes[p]];
    if (o.spec.params.empty()) {
      o.spec.dtype = dtypes[p];
      o.first_pos = pos;
    }
    o.spec.params.push_back(p);
    o.spec.bytes += numels[p] * (int64_t)c10::elementSize(dtypes[p]);
    const int64_t limit = o.closed_so_far == 0 ? first_bucket_bytes : bucket_cap_bytes;
    if (o.spec.bytes >= limit) {
      done.emplace_back(o.first_pos, std::move(o.spec));
      o.spec = BucketSpec{};
      ++o.closed_so_far;
    }
  }
  for (auto& [dtype, o] : open)
    if (!o.spec.params.empty()) done.emplace_back(o.first_pos, std::move(o.spec));
  std::stable_sort(done.begin(), done.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<BucketSpec> out;
  out.reserve(done.size());
  for (auto& d : done) out.push_back(std::move(d.second));
  return out;
}

}  // namespace lockstep::ddp
