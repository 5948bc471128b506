// Cross-rank model verification; see include/lockstep/parallel/ddp/model_check.h.
#include <lockstep/parallel/ddp/model_check.h>

#include <ATen/ATen.h>

#include <cstring>
#include <sstream>

namespace lockstep::ddp {

namespace {

struct ParamDesc {
  std::string name, dtype, shape;
};

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

// One line per parameter: "name\tdtype\tshape\n" (names contain no tabs/newlines).
std::string describe(const std::vector<std::string>& names, const std::vector<at::Tensor>& ps) {
  std::string out;
  for (size_t i = 0; i < ps.size(); ++i)
    out += names[i] + '\t' + comm::dtype_name(ps[i].scalar_type()) + '\t' +
           shape_str(ps[i].sizes()) + '\n';
  return out;
}

std::vector<ParamDesc> parse(const char* p, int64_t len) {
  std::vector<ParamDesc> out;
  std::string s(p, p + len);
  std::istringstream is(s);
  std::string line;
  while (std::getline(is, line)) {
    ParamDesc d;
    auto t1 = line.find('\t'), t2 = line.rfind('\t');
    d.name = line.substr(0, t1);
    d.dtype = line.substr(t1 + 1, t2 - t1 - 1);
    d.shape = line.substr(t2 + 1);
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

void verify_same_model(comm::ProcessGroup& group, const std::vector<std::string>& names,
                       const std::vector<at::Tensor>& params) {
  const int P = group.size();
  if (P == 1) return;
  const std::string mine = describe(names, params);
  // Gathered with allreduce (each rank fills only its own slot of a zeroed
  // buffer) rather than allgather: it is the one collective every backend
  // implements for every dtype, and this runs once per construction.
  auto lens = at::zeros({P}, at::kLong);
  lens.data_ptr<int64_t>()[group.rank()] = (int64_t)mine.size();
  group.allreduce(lens)->wait();
  const int64_t* L = lens.data_ptr<int64_t>();
  int64_t maxlen = 1;
  for (int r = 0; r < P; ++r) maxlen = std::max(maxlen, L[r]);
  auto all = at::zeros({maxlen * P}, at::kByte);
  std::memcpy(all.data_ptr<uint8_t>() + group.rank() * maxlen, mine.data(), mine.size());
  group.allreduce(all)->wait();
  const char* base = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());

  // Every rank runs the same comparison on the same data, so all throw alike.
  const auto ref = parse(base, L[0]);
  for (int r = 1; r < P; ++r) {
    const auto other = parse(base + r * maxlen, L[r]);
    const size_t n = std::min(ref.size(), other.size());
    for (size_t i = 0; i < n; ++i) {
      if (ref[i].dtype == other[i].dtype && ref[i].shape == other[i].shape) continue;
      throw ModelMismatch(lockstep::detail::concat(
          "DDP: ranks hold different models: parameter #", i, " '", ref[i].name, "' is ",
          ref[i].dtype, ref[i].shape, " on rank 0 but '", other[i].name, "' is ", other[i].dtype,
          other[i].shape, " on rank ", r, " (seen from rank ", group.rank(), ")"));
    }
    if (ref.size() != other.size()) {
      const auto& longer = ref.size() > other.size() ? ref : other;
      throw ModelMismatch(lockstep::detail::concat(
          "DDP: ranks hold different models: rank 0 has ", ref.size(), " parameters, rank ", r,
          " has ", other.size(), "; first parameter present on only one of them: '", longer[n].name,
          "' ", longer[n].dtype, longer[n].shape, " (on rank ", ref.size() > other.size() ? 0 : r,
          ", seen from rank ", group.rank(), ")"));
    }
  }
}

}  // namespace lockstep::ddp
