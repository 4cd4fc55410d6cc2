// The PromQL of a Grafana dashboard (deploy/grafana/pagealloc.json), for the
// tests that hand it to Prometheus: promtool's parser (metrics_test) and a
// live Prometheus scraping a daemon (prometheus_e2e_test).
//
//   ASSERT_OK_AND_ASSIGN(Dashboard dashboard, LoadDashboard(path));
//   for (const DashboardQuery& query : dashboard.queries) {
//     ASSERT_OK_AND_ASSIGN(std::string promql,
//                          SubstituteVariables(query.expr, values));
//     ...
//   }

#ifndef PAGEALLOC_TESTS_GRAFANA_DASHBOARD_H_
#define PAGEALLOC_TESTS_GRAFANA_DASHBOARD_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"

namespace pagealloc::testing {

// One PromQL expression of the dashboard, with Grafana's variables still in
// it ($job, ${instance}, $__rate_interval).
struct DashboardQuery {
  // Where it is: "panel 15 (Call latency p50) target A" or
  // "variable instance".
  std::string where;
  std::string panel_title;  // empty for a variable
  std::string expr;
};

struct Dashboard {
  google::protobuf::Struct json;  // the whole document
  // Every panel's targets (rows' nested panels included), in order, then
  // each query variable's series selector (the first argument of its
  // label_values(...)).
  std::vector<DashboardQuery> queries;
  // The names of the dashboard's variables (templating.list), in order.
  std::vector<std::string> variables;
};

// Reads and parses the dashboard at `path` with protobuf's JSON parser.
// Returns NOT_FOUND when the file cannot be read, INVALID_ARGUMENT when it
// is not JSON, a panel target has no expr, or a query variable's query is
// not label_values(...).
absl::StatusOr<Dashboard> LoadDashboard(const std::string& path);

// Replaces Grafana's variable references ($name and ${name}) in `expr` by
// `values` (built-ins included: "__rate_interval", "__interval", ...).
// Returns INVALID_ARGUMENT naming a variable `values` lacks, or a ${...}
// form with a format (${name:csv}), which we do not expand.
absl::StatusOr<std::string> SubstituteVariables(
    absl::string_view expr, const std::map<std::string, std::string>& values);

// A Prometheus rule file with one recording rule per expression
// (record: "dashboard:query_<i>"), for `promtool check rules`.
std::string RecordingRuleFile(const std::vector<std::string>& exprs);

}  // namespace pagealloc::testing

#endif  // PAGEALLOC_TESTS_GRAFANA_DASHBOARD_H_
