#include "tests/grafana_dashboard.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace pagealloc::testing {
namespace {

// The selector of a Grafana variable query "label_values(SELECTOR, label)"
// (the selector may hold commas: the label follows the last one).
absl::StatusOr<std::string> LabelValuesSelector(absl::string_view text) {
  if (!absl::ConsumePrefix(&text, "label_values(") ||
      !absl::ConsumeSuffix(&text, ")")) {
    return absl::InvalidArgumentError("not label_values(...)");
  }
  const size_t comma = text.rfind(',');
  if (comma == absl::string_view::npos || comma == 0) {
    return absl::InvalidArgumentError("no selector");
  }
  const absl::string_view label =
      absl::StripLeadingAsciiWhitespace(text.substr(comma + 1));
  if (label.empty() || !std::all_of(label.begin(), label.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '_';
      })) {
    return absl::InvalidArgumentError("no label");
  }
  return std::string(text.substr(0, comma));
}

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// The field `name` of `object`, or an empty value.
const Value& Field(const Struct& object, const std::string& name) {
  auto it = object.fields().find(name);
  return it == object.fields().end() ? Value::default_instance() : it->second;
}

absl::Status AddPanels(const ListValue& panels, Dashboard* dashboard) {
  for (const Value& panel_value : panels.values()) {
    const Struct& panel = panel_value.struct_value();
    const std::string title = Field(panel, "title").string_value();
    const int id = static_cast<int>(Field(panel, "id").number_value());
    for (const Value& target_value :
         Field(panel, "targets").list_value().values()) {
      const Struct& target = target_value.struct_value();
      const std::string ref = Field(target, "refId").string_value();
      const std::string where =
          absl::StrFormat("panel %d (%s) target %s", id, title, ref);
      const std::string expr = Field(target, "expr").string_value();
      if (expr.empty()) {
        return absl::InvalidArgumentError(where + " has no expr");
      }
      dashboard->queries.push_back({where, title, expr});
    }
    // A collapsed row holds its panels.
    RETURN_IF_ERROR(AddPanels(Field(panel, "panels").list_value(), dashboard));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dashboard> LoadDashboard(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  Dashboard dashboard;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(text.str(), &dashboard.json);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not JSON: ", parsed.ToString()));
  }
  RETURN_IF_ERROR(
      AddPanels(Field(dashboard.json, "panels").list_value(), &dashboard));

  for (const Value& variable_value :
       Field(Field(dashboard.json, "templating").struct_value(), "list")
           .list_value()
           .values()) {
    const Struct& variable = variable_value.struct_value();
    const std::string name = Field(variable, "name").string_value();
    dashboard.variables.push_back(name);
    if (Field(variable, "type").string_value() != "query") continue;
    // The query is an object ({"query": ...}) since Grafana 10, a string
    // before.
    const Value& query = Field(variable, "query");
    const std::string text =
        query.has_struct_value()
            ? Field(query.struct_value(), "query").string_value()
            : query.string_value();
    absl::StatusOr<std::string> selector = LabelValuesSelector(text);
    if (!selector.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "variable %s: query '%s' is not label_values(selector, label)", name,
          text));
    }
    dashboard.queries.push_back({"variable " + name, "", *selector});
  }
  return dashboard;
}

absl::StatusOr<std::string> SubstituteVariables(
    absl::string_view expr, const std::map<std::string, std::string>& values) {
  std::string out;
  size_t i = 0;
  auto is_name = [](char c) { return std::isalnum(c) || c == '_'; };
  while (i < expr.size()) {
    if (expr[i] != '$') {
      out += expr[i++];
      continue;
    }
    std::string name;
    size_t next;
    if (i + 1 < expr.size() && expr[i + 1] == '{') {
      const size_t close = expr.find('}', i + 2);
      if (close == absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("unterminated ${ in: ", expr));
      }
      name = std::string(expr.substr(i + 2, close - i - 2));
      next = close + 1;
    } else {
      next = i + 1;
      while (next < expr.size() && is_name(expr[next])) ++next;
      name = std::string(expr.substr(i + 1, next - i - 1));
    }
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_name)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unsupported variable reference '%s' in: %s",
                          expr.substr(i, next - i), expr));
    }
    auto it = values.find(name);
    if (it == values.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("no value for variable $%s in: %s", name, expr));
    }
    out += it->second;
    i = next;
  }
  return out;
}

std::string RecordingRuleFile(const std::vector<std::string>& exprs) {
  std::string file = "groups:\n  - name: dashboard\n    rules:\n";
  for (size_t i = 0; i < exprs.size(); ++i) {
    // A YAML double-quoted scalar.
    const std::string quoted = absl::StrReplaceAll(
        exprs[i], {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
    absl::StrAppendFormat(&file,
                          "      - record: dashboard:query_%d\n"
                          "        expr: \"%s\"\n",
                          i, quoted);
  }
  return file;
}

}  // namespace pagealloc::testing
