#include "common/command_line.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/config.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/build_info.h"

// Abseil reports a usage error (unknown flag, malformed value) on stderr,
// calls this hook, then exits with 1, the code our programs keep for
// failures at run time. Debian's Abseil (20220623) has no option for that
// exit code; this hook, declared in absl/flags/usage_config.h for programs
// to define, runs after the report, so exiting here makes every usage
// error exit 2.
extern "C" void ABSL_INTERNAL_C_SYMBOL(AbslInternalReportFatalUsageError)(
    absl::string_view) {
  std::cerr << "Run with --help for this program's flags.\n";
  std::exit(pagealloc::kExitUsage);
}

namespace pagealloc {
namespace {

// Appends `text` to `out` wrapped at `width` columns, each line indented.
void AppendWrapped(absl::string_view text, int indent, int width,
                   std::string* out) {
  const std::string pad(indent, ' ');
  std::string line;
  for (absl::string_view word :
       absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (!line.empty() &&
        static_cast<int>(pad.size() + line.size() + 1 + word.size()) > width) {
      absl::StrAppend(out, pad, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(out, pad, line, "\n");
}

bool Matches(const absl::CommandLineFlag& flag, absl::string_view filter) {
  return filter.empty() || absl::StrContains(flag.Name(), filter) ||
         absl::StrContains(flag.Help(), filter);
}

void AppendFlag(const absl::CommandLineFlag& flag, absl::string_view unit,
                std::string* out) {
  const std::string value = flag.DefaultValue();
  absl::StrAppend(out, "  --", flag.Name(), "=", value.empty() ? "\"\"" : value,
                  unit.empty() ? "" : absl::StrCat("  (", unit, ")"), "\n");
  AppendWrapped(flag.Help(), 6, 79, out);
}

bool IsOwnFlag(const absl::CommandLineFlag& flag, const CommandLineSpec& spec) {
  return absl::EndsWith(flag.Filename(), spec.flags_file);
}

// What a flag of this type accepts, in words; "" for a string (anything).
std::string Accepted(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "true or false (also 1 or 0, yes or no)";
  if (flag.IsOfType<int>() || flag.IsOfType<int32_t>()) {
    return "an integer of 32 bits";
  }
  if (flag.IsOfType<int64_t>()) return "an integer";
  if (flag.IsOfType<uint64_t>() || flag.IsOfType<uint32_t>()) {
    return "a non-negative integer";
  }
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "a number";
  if (flag.IsOfType<std::vector<std::string>>()) {
    return "a comma-separated list";
  }
  return "";
}

// The unit --help shows for `name` in `spec`, "" when none.
absl::string_view UnitOf(const CommandLineSpec& spec, absl::string_view name) {
  for (const FlagGroup& group : spec.groups) {
    for (const FlagDoc& doc : group.flags) {
      if (name == doc.name) return doc.unit;
    }
  }
  return "";
}

// Checks the value of every --name=value (or --name value) of the
// program's own flags before Abseil parses them, so that a malformed value
// is refused in our words: the flag, the value and what it accepts.
void CheckOwnFlagValues(int argc, char** argv, const CommandLineSpec& spec) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      continue;
    }
    const size_t equals = arg.find('=');
    const std::string name(arg.substr(0, equals));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || !IsOwnFlag(*flag, spec)) continue;
    const std::string accepted = Accepted(*flag);
    if (accepted.empty()) continue;
    std::string value;
    if (equals != absl::string_view::npos) {
      value = std::string(arg.substr(equals + 1));
    } else if (flag->IsOfType<bool>() || i + 1 >= argc) {
      continue;  // --flag (true), or Abseil's "missing value"
    } else {
      value = argv[i + 1];
    }
    // Parsing sets the flag; Abseil sets it again right after, from the
    // same arguments, so a value that parses changes nothing.
    std::string error;
    const bool parsed = flag->ParseFrom(value, &error);
    if (parsed) continue;
    const absl::string_view unit = UnitOf(spec, name);
    ExitUsage(spec.program,
              absl::StrCat("--", name, "=", value, " is not ", accepted, " (",
                           unit.empty() ? "" : absl::StrCat(unit, "; "),
                           "default ", flag->DefaultValue(), ")"));
  }
}

}  // namespace

std::string HelpText(const CommandLineSpec& spec, absl::string_view filter) {
  std::string out =
      absl::StrCat(spec.synopsis, "\n\nFlags (--name=default):\n");
  const std::set<std::string> hidden(spec.hidden.begin(), spec.hidden.end());
  std::set<std::string> listed;
  for (const FlagGroup& group : spec.groups) {
    std::string body;
    for (const FlagDoc& doc : group.flags) {
      listed.insert(doc.name);
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(doc.name);
      if (flag == nullptr || !Matches(*flag, filter)) continue;
      AppendFlag(*flag, doc.unit, &body);
    }
    if (!body.empty()) absl::StrAppend(&out, "\n", group.title, ":\n", body);
  }
  // Flags of the program that no group names, by name: with groups these
  // are an omission (the server's test looks for this section).
  std::map<absl::string_view, const absl::CommandLineFlag*> rest;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOwnFlag(*flag, spec) && !flag->IsRetired() &&
        !listed.count(std::string(name)) && !hidden.count(std::string(name)) &&
        Matches(*flag, filter)) {
      rest.emplace(name, flag);
    }
  }
  if (!rest.empty()) {
    absl::StrAppend(&out, "\n", spec.groups.empty() ? "flags" : "other", ":\n");
    for (const auto& [name, flag] : rest) AppendFlag(*flag, "", &out);
  }
  absl::StrAppend(&out, "\n");
  AppendWrapped(
      "--version prints the version, commit and backends; --helpfull lists "
      "every flag linked in (gRPC's and Abseil's too). Usage errors exit 2, "
      "failures 1.",
      0, 79, &out);
  return out;
}

std::vector<char*> ParseCommandLine(int argc, char** argv,
                                    const CommandLineSpec& spec) {
  absl::SetProgramUsageMessage(spec.synopsis);
  absl::FlagsUsageConfig config;
  const std::string flags_file = spec.flags_file;
  const auto own = [flags_file](absl::string_view file) {
    return absl::EndsWith(file, flags_file);
  };
  config.contains_helpshort_flags = own;
  config.contains_help_flags = own;
  config.contains_helppackage_flags = own;
  const std::string program = spec.program;
  config.version_string = [program] { return VersionText(program); };
  absl::SetFlagsUsageConfig(config);
  // Abseil's --help lists the flags of a file named after the program
  // ("pagealloc-server.cc"), which ours are not, and exits 1; we answer
  // --help and --version before it parses.
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      continue;
    }
    if (arg == "help" || arg == "helpshort") {
      std::cout << HelpText(spec);
      std::exit(0);
    }
    if (absl::ConsumePrefix(&arg, "help=")) {
      std::cout << HelpText(spec, arg);
      std::exit(0);
    }
    if (arg == "version") {
      std::cout << VersionText(spec.program);
      std::exit(0);
    }
  }
  CheckOwnFlagValues(argc, argv, spec);
  return absl::ParseCommandLine(argc, argv);
}

void ExitUsage(absl::string_view program, absl::string_view message) {
  std::cerr << program << ": " << message << "\n"
            << "Run " << program << " --help for its flags.\n";
  std::exit(kExitUsage);
}

std::string UnixSchemeHint(absl::string_view address) {
  absl::string_view path = address;
  if (absl::ConsumePrefix(&path, "unix://")) {
    // unix:///abs is right; unix://rel reads "rel" as an authority.
    if (path.empty() || absl::StartsWith(path, "/")) return "";
  } else if (absl::StrContains(address, ':')) {
    return "";  // a scheme, or host:port
  }
  // A bare word ("localhost") is a host without a port, not a path.
  if (!absl::StrContains(path, '/') && !absl::EndsWith(path, ".sock")) {
    return "";
  }
  std::string absolute(path);
  if (!absl::StartsWith(path, "/")) {
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) == nullptr) return "";
    absolute = absl::StrCat(cwd, "/", path);
  }
  return absl::StrCat("did you mean unix://", absolute, "?");
}

}  // namespace pagealloc
