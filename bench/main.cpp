// lockstep-bench: benchmarks that measure lockstep beside its peers in the same run.
//
//   lockstep-bench collectives|compression|ddp|fsdp|train|optimizer|memory|blas|checkpoint|
//                  thin-links
//                  [OPTIONS]
//   (--help on each)
//
// Exit status: 0 ok, 1 a benchmark failed, 2 a usage error (unknown flag, bad value).
#include "commands.h"

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

// A usage error: the message, then the usage line of the (sub)command it concerns.
int usage_error(const CLI::App& app, const CLI::ParseError& e) {
  const CLI::App* target = &app;
  std::string name = app.get_name();
  if (const auto subs = app.get_subcommands(); !subs.empty()) {
    target = subs.front();
    name += " " + target->get_name();
  }
  std::string what = e.what();
  if (target == &app && !app.remaining().empty())  // a word where the benchmark belongs
    what = "unknown benchmark '" + app.remaining().front() + "'";
  std::fprintf(stderr, "%s: %s\n%sRun with --help for more information.\n", name.c_str(),
               what.c_str(), CLI::Formatter().make_usage(target, name).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep::bench;
  CLI::App app{"lockstep-bench: benchmarks that measure lockstep beside its peers in the same run",
               "lockstep-bench"};
  app.require_subcommand(1);
  const std::vector<Command> commands{
      collectives_command(app), compression_command(app), ddp_command(app),    fsdp_command(app),
      train_command(app),       optimizer_command(app),   memory_command(app), blas_command(app),
      checkpoint_command(app),  thin_links_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success))
      return app.exit(e);  // --help
    return usage_error(app, e);
  }
  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.run();
    return 2;  // unreachable: require_subcommand(1)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-bench: %s\n", e.what());
    return 1;
  }
}
