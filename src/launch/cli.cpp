// The shared command-line rules (lockstep/launch/cli.h).
#include "lockstep/launch/cli.h"

#include <algorithm>
#include <ostream>
#include <sstream>

#include "lockstep/launch/launcher.h"

namespace lockstep::launch {
namespace {

std::string dashed(std::string s) {
  for (std::size_t i = 2; i < s.size(); ++i)
    if (s[i] == '_') s[i] = '-';
  return s;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// `app` and the subcommands the command line selected, outermost first ("lockstep-bench",
// "ddp"): after a failed parse, those it got to.
std::vector<const CLI::App*> selected_chain(const CLI::App& app) {
  std::vector<const CLI::App*> chain{&app};
  while (!chain.back()->get_subcommands().empty())
    chain.push_back(chain.back()->get_subcommands().front());
  return chain;
}

// Every flag of the apps in `chain`.
std::vector<std::string> chain_flags(const std::vector<const CLI::App*>& chain) {
  std::vector<std::string> out;
  for (const CLI::App* a : chain) {
    const std::vector<std::string> f = flags_of(*a);
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

// The command-line arguments that look like flags but are none of `known`, in order.
std::vector<std::string> unknown_flags(const std::vector<std::string>& known, int argc,
                                       const char* const* argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || (arg[1] >= '0' && arg[1] <= '9') || arg[1] == '.')
      continue;  // a value or a negative number
    const std::string name = arg.substr(0, arg.find('='));
    if (std::find(known.begin(), known.end(), name) == known.end()) out.push_back(name);
  }
  return out;
}

}  // namespace

std::string nearest_flag(const std::string& given, const std::vector<std::string>& valid) {
  const std::string g = dashed(given);
  if (g.size() - std::min(g.find_first_not_of('-'), g.size()) < 2) return "";  // "--", "-x"
  std::vector<std::string> prefixed;
  for (const auto& v : valid)
    if (v.size() > g.size() && v.compare(0, g.size(), g) == 0 && g.size() > 2)
      prefixed.push_back(v);
  if (prefixed.size() == 1) return prefixed.front();
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& v : valid) {
    const std::size_t d = edit_distance(g, v);
    if (d < best_d) best_d = d, best = v;
  }
  const std::size_t limit = std::max<std::size_t>(2, g.size() / 3);
  return best_d <= limit ? best : std::string();
}

std::vector<std::string> flags_of(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options()) {
    for (const auto& l : o->get_lnames()) out.push_back("--" + l);
    for (const auto& s : o->get_snames()) out.push_back("-" + s);
  }
  return out;
}

std::string usage_line(const CLI::App& app) {
  std::istringstream help(app.help());
  for (std::string line; std::getline(help, line);)
    if (line.rfind("Usage:", 0) == 0) return line;
  return "Usage: " + app.get_name() + " [OPTIONS]";
}

std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv,
                                      std::ostream& out, std::ostream& err) {
  const std::string name = app.get_name().empty() ? std::string(argv[0]) : app.get_name();
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    // The error concerns the innermost subcommand the command line reached, if any.
    const std::vector<const CLI::App*> chain = selected_chain(app);
    const CLI::App& target = *chain.back();
    std::string who = name;
    for (std::size_t i = 1; i < chain.size(); ++i) who += " " + chain[i]->get_name();
    const std::vector<std::string> known = chain_flags(chain);
    const std::vector<std::string> unknown = unknown_flags(known, argc, argv);
    const std::string word = target.remaining().empty() ? "" : target.remaining().front();
    const std::vector<const CLI::App*> subs =
        target.get_subcommands([](const CLI::App* a) { return !a->get_name().empty(); });
    if (!unknown.empty()) {
      const std::string near = nearest_flag(unknown.front(), known);
      err << who << ": unknown option '" << unknown.front() << "'"
          << (near.empty() ? "" : "; did you mean '" + near + "'?") << "\n";
    } else if (!word.empty() && !subs.empty()) {
      // A word where a subcommand belongs ("lockstep-bench ddpp").
      std::vector<std::string> commands;
      commands.reserve(subs.size());
      for (const CLI::App* sub : subs) commands.push_back(sub->get_name());
      const std::string near = nearest_flag(word, commands);
      err << who << ": unknown command '" << word << "'"
          << (near.empty() ? "" : "; did you mean '" + near + "'?") << "\n";
    } else {
      err << who << ": " << e.what() << "\n";
    }
    err << usage_line(app) << "\n";  // help() reaches the selected subcommand's usage
    return kExitUsage;
  }
}

}  // namespace lockstep::launch
