// ctsm_score_exported EXPORT_DIR DATA_DIR CUTOFF_DAY HORIZON_DAYS MAX_LEN MAX_CANDIDATES
// Loads an exported CTSM with nothing but the card and the weights, scores every
// client's backtest items in one process, and prints "auc <value> items <n>".
#include <ctsm/backtest_metrics.h>
#include <ctsm/events_stream.h>
#include <ctsm/model_export.h>

#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: ctsm_score_exported EXPORT_DIR DATA_DIR CUTOFF_DAY HORIZON_DAYS MAX_LEN "
                 "MAX_CANDIDATES\n";
    return 2;
  }
  try {
    torch::set_num_threads(1);
    auto model = ctsm::load_exported_model(argv[1]);
    const int64_t cutoff = std::stoll(argv[3]) * 86400,
                  horizon = cutoff + std::stoll(argv[4]) * 86400;
    ctsm::EventStream stream(ctsm::EventStream::list_shards(argv[2]), {0, 1});
    ctsm::BacktestMetrics metrics(4096, 5);
    std::vector<ctsm::CtsmExample> batch;
    torch::NoGradGuard ng;
    auto flush = [&] {
      if (batch.empty()) return;
      auto b = ctsm::collate(batch);
      auto z = model->forward(b);
      if (!torch::isfinite(z).all().item<bool>()) throw lockstep::Error("non-finite score");
      metrics.add(z, b);
      batch.clear();
    };
    while (auto c = stream.next()) {
      auto ex =
          ctsm::make_eval_example(*c, cutoff, horizon, std::stoi(argv[5]), std::stoi(argv[6]));
      bool any = false;
      for (auto& p : ex.positions) any |= p.is_target;
      if (any) batch.push_back(std::move(ex));
      if (batch.size() == 256) flush();
    }
    flush();
    const auto r = metrics.reduce(nullptr);
    uint32_t crc = 0;  // same definition as summary.json's param_crc32
    for (const auto& p : model->parameters()) {
      auto t = p.detach().contiguous();
      crc = ctsm::crc32(t.data_ptr(), size_t(t.numel() * t.element_size()), crc);
    }
    std::printf("auc %.6f items %lld param_crc32 %u\n", r.auc,
                (long long)(r.positives + r.negatives), crc);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ctsm_score_exported: " << e.what() << "\n";
    return 1;
  }
}
