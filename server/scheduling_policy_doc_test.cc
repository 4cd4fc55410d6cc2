// docs/design.md, section 6, holds the scheduling table for the documented
// settings; this test renders the policy's rows for each and compares them
// with the table's rows, so that the table says what the code does.

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "server/scheduling_policy.h"

namespace pagealloc {
namespace {

constexpr char kBegin[] = "<!-- scheduling-policy-table:begin -->";
constexpr char kEnd[] = "<!-- scheduling-policy-table:end -->";

struct Documented {
  const char* label;  // the table's first column
  SchedulingPolicy::Flags flags;
  unsigned cpus;
  // Only the gRPC row: the settings change nothing else.
  bool grpc_only = false;
};

std::vector<Documented> DocumentedSettings() {
  SchedulingPolicy::Flags window_without_spin;
  window_without_spin.batcher_spin_us = 0;
  window_without_spin.batch_window_us = 100;
  SchedulingPolicy::Flags no_answer_threads;
  no_answer_threads.grpc_answer_threads = 0;
  return {
      {"defaults, 8 or more CPUs", {}, 16},
      {"defaults, fewer than 8 CPUs", {}, 4},
      {"`--batcher_spin_us=0 --batch_window_us=100`", window_without_spin, 16},
      {"`--grpc_answer_threads=0`, 8 or more CPUs", no_answer_threads, 16,
       true},
  };
}

std::string DesignDoc() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string path =
      srcdir == nullptr
          ? std::string("docs/design.md")
          : absl::StrFormat("%s/%s/docs/design.md", srcdir,
                            workspace != nullptr ? workspace : "pagealloc");
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(SchedulingPolicyDocTest, DesignTableMatchesThePolicy) {
  std::vector<std::string> expected;
  for (const Documented& documented : DocumentedSettings()) {
    absl::StatusOr<SchedulingPolicy> policy = SchedulingPolicy::Create(
        SchedulingPolicy::SettingsFromFlags(documented.flags, documented.cpus));
    ASSERT_TRUE(policy.ok()) << policy.status();
    for (const SchedulingRow& row : policy->Rows()) {
      if (documented.grpc_only && row.situation != "gRPC allocation call") {
        continue;
      }
      expected.push_back(SchedulingPolicy::MarkdownRow(documented.label, row));
    }
  }
  const std::string doc = DesignDoc();
  ASSERT_FALSE(doc.empty()) << "docs/design.md is not in the runfiles";
  const size_t begin = doc.find(kBegin);
  const size_t end = doc.find(kEnd);
  ASSERT_NE(begin, std::string::npos) << kBegin << " is not in design.md";
  ASSERT_NE(end, std::string::npos) << kEnd << " is not in design.md";
  ASSERT_LT(begin, end);
  std::vector<std::string> documented_rows;
  const std::vector<std::string> lines = absl::StrSplit(
      doc.substr(begin + sizeof(kBegin) - 1, end - begin - sizeof(kBegin) + 1),
      '\n', absl::SkipWhitespace());
  // The header and the separator come first.
  ASSERT_GE(lines.size(), 2u);
  for (size_t i = 2; i < lines.size(); ++i) {
    documented_rows.emplace_back(absl::StripAsciiWhitespace(lines[i]));
  }
  EXPECT_EQ(documented_rows, expected)
      << "docs/design.md's scheduling table differs from the policy; its rows "
         "are:\n"
      << absl::StrJoin(expected, "\n");
}

}  // namespace
}  // namespace pagealloc
