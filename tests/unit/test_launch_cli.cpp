// The command-line rules every lockstep program shares (lockstep/launch/cli.h): unknown
// flags exit 2 with the nearest valid flag and the usage line, not CLI11's 109.
#include "lockstep/launch/cli.h"

#include <gtest/gtest.h>

#include <sstream>

#include "lockstep/launch/launcher.h"
#include "lockstep/launch/options.h"

using namespace lockstep::launch;

namespace {

struct Parsed {
  std::optional<int> rc;
  std::string out, err;
  bool resume = false;
  std::string config;
};

Parsed parse(std::vector<const char*> args) {
  Parsed p;
  CLI::App app{"a test program", "prog"};
  app.add_option("config", p.config, "config")->required();
  app.add_flag("--resume", p.resume, "resume");
  // C++20 makes add_flag(name, "text") ambiguous in CLI11 2.1 (arrays become constructible).
  app.add_flag("--generate-only")->description("generate");
  std::vector<std::string> sets;
  app.add_option("--set", sets, "override");
  args.insert(args.begin(), "prog");
  std::ostringstream out, err;
  p.rc = parse_command_line(app, int(args.size()), args.data(), out, err);
  p.out = out.str();
  p.err = err.str();
  return p;
}

TEST(LaunchCli, NearestFlag) {
  const std::vector<std::string> flags = {"--resume", "--generate-only", "--set", "--help", "-h"};
  EXPECT_EQ(nearest_flag("--resum", flags), "--resume");
  EXPECT_EQ(nearest_flag("--resmue", flags), "--resume");
  EXPECT_EQ(nearest_flag("--generate_only", flags), "--generate-only");
  EXPECT_EQ(nearest_flag("--gen", flags), "--generate-only");  // a unique prefix
  EXPECT_EQ(nearest_flag("--st", flags), "--set");
  EXPECT_EQ(nearest_flag("--frobnicate", flags), "");
  EXPECT_EQ(nearest_flag("--", flags), "");
}

TEST(LaunchCli, GoodCommandLineGoesOn) {
  const Parsed p = parse({"c.toml", "--resume", "--set", "a.b=1"});
  EXPECT_FALSE(p.rc.has_value());
  EXPECT_TRUE(p.resume);
  EXPECT_EQ(p.config, "c.toml");
  EXPECT_EQ(p.err, "");
}

TEST(LaunchCli, UnknownFlagExits2WithNearestAndUsage) {
  const Parsed p = parse({"c.toml", "--resum"});
  ASSERT_TRUE(p.rc.has_value());
  EXPECT_EQ(*p.rc, kExitUsage);
  EXPECT_EQ(p.err.substr(0, p.err.find('\n')),
            "prog: unknown option '--resum'; did you mean '--resume'?");
  EXPECT_NE(p.err.find("\nUsage: prog [OPTIONS] config"), std::string::npos) << p.err;
  const Parsed q = parse({"c.toml", "--frobnicate=3"});
  EXPECT_EQ(q.rc, kExitUsage);
  EXPECT_EQ(q.err.substr(0, q.err.find('\n')), "prog: unknown option '--frobnicate'");
}

TEST(LaunchCli, OtherErrorsExit2Too) {
  const Parsed p = parse({"--resume"});  // no config
  EXPECT_EQ(p.rc, kExitUsage);
  EXPECT_EQ(p.err.substr(0, p.err.find('\n')), "prog: config is required");
  const Parsed h = parse({"--help"});
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find("Usage: prog"), std::string::npos);
}

// A program with subcommands (lockstep-bench): the subcommand's flags, its name and usage.
TEST(LaunchCli, SubcommandFlagsAndNames) {
  CLI::App app{"a program with commands", "prog"};
  app.require_subcommand(1);
  int steps = 0;
  app.add_subcommand("train", "train")->add_option("--steps", steps, "steps");
  app.add_subcommand("eval", "eval");
  auto run = [&](std::vector<const char*> args, std::string& err) {
    args.insert(args.begin(), "prog");
    std::ostringstream out, e;
    const auto rc = parse_command_line(app, int(args.size()), args.data(), out, e);
    err = e.str();
    return rc;
  };
  std::string err;
  EXPECT_FALSE(run({"train", "--steps", "3"}, err).has_value()) << err;
  EXPECT_EQ(steps, 3);
  app.clear();
  EXPECT_EQ(run({"train", "--stesp", "3"}, err), kExitUsage);
  EXPECT_EQ(err.substr(0, err.find('\n')),
            "prog train: unknown option '--stesp'; did you mean '--steps'?");
  EXPECT_NE(err.find("\nUsage: prog train [OPTIONS]"), std::string::npos) << err;
  app.clear();
  EXPECT_EQ(run({"trian"}, err), kExitUsage);
  EXPECT_EQ(err.substr(0, err.find('\n')), "prog: unknown command 'trian'; did you mean 'train'?");
}

TEST(LaunchCli, LauncherNamesTheNearestFlag) {
  try {
    parse_args({"--nproc-per-nod", "2", "prog"});
    ADD_FAILURE() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unknown option '--nproc-per-nod'; did you mean '--nproc-per-node'?"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
