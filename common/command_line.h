// The command line every pagealloc program shares (pagealloc-server,
// pagealloc-cli, pagealloc-bench):
//
//   --help, --helpshort   the program's own flags, by group, with defaults
//                         and units (not the flags of gRPC or Abseil)
//   --help=WORD           the same, only flags whose name or help has WORD
//   --helpfull            Abseil's list of every flag linked in
//   --version             version, commit and backends (common/build_info.h)
//
// Exit codes: 0 after --help or --version, kExitUsage (2) for a usage error
// (an unknown flag, a malformed value, a value out of range: Abseil's own
// parse errors included), kExitFailure (1) for a failure at run time.
//
//   int main(int argc, char** argv) {
//     std::vector<char*> args = pagealloc::ParseCommandLine(argc, argv, kSpec);
//     if (bad) pagealloc::ExitUsage(kSpec.program, "--lease_ms=0 is ...");
//   }

#ifndef PAGEALLOC_COMMON_COMMAND_LINE_H_
#define PAGEALLOC_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pagealloc {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// One flag in --help: its name and the unit of its value ("" for none).
struct FlagDoc {
  const char* name;
  const char* unit = "";
};

struct FlagGroup {
  const char* title;  // "pool", "batching"
  std::vector<FlagDoc> flags;
};

struct CommandLineSpec {
  const char* program;  // "pagealloc-server"
  // The usage lines --help starts with.
  const char* synopsis;
  // The source file that defines the program's flags, as Abseil records it
  // ("server/main.cc"): --help shows the flags defined there.
  const char* flags_file;
  // --help's groups, in order. Flags of `flags_file` that no group names
  // follow under "other" (empty groups: all of them, by name).
  std::vector<FlagGroup> groups;
  // Flags of `flags_file` that --help leaves out (internal ones).
  std::vector<std::string> hidden;
};

// Parses argv as absl::ParseCommandLine does and returns the positional
// arguments (argv[0] first). Handles --help, --helpshort, --help=WORD and
// --version itself (printing to stdout and exiting 0), and makes every
// usage error Abseil finds exit with kExitUsage.
std::vector<char*> ParseCommandLine(int argc, char** argv,
                                    const CommandLineSpec& spec);

// --help's text; `filter` keeps only flags whose name or help contains it.
std::string HelpText(const CommandLineSpec& spec,
                     absl::string_view filter = "");

// Prints "<program>: <message>" and where to find the flags to stderr and
// exits with kExitUsage.
[[noreturn]] void ExitUsage(absl::string_view program,
                            absl::string_view message);

// For a gRPC address that names a Unix socket without the unix:// scheme
// ("/tmp/x.sock", "x.sock", "unix://tmp/x.sock"), what was probably meant:
// "did you mean unix:///tmp/x.sock?"; "" for an address with a scheme or
// a port. Relative paths are resolved against the working directory.
std::string UnixSchemeHint(absl::string_view address);

}  // namespace pagealloc

#endif  // PAGEALLOC_COMMON_COMMAND_LINE_H_
