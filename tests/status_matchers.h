// GoogleTest matchers for absl::Status and absl::StatusOr<T>.
//
// Debian 12's Abseil (20220623) ships no status matchers, so we keep these:
//   EXPECT_THAT(pool.Free(...), StatusIs(absl::StatusCode::kNotFound,
//                                       HasSubstr("unknown owner")));
//   EXPECT_THAT(pool.Rollback(1), IsOkAndHolds(3));
//   EXPECT_OK(status);  ASSERT_OK_AND_ASSIGN(auto x, MakeX());

#ifndef PAGEALLOC_TESTS_STATUS_MATCHERS_H_
#define PAGEALLOC_TESTS_STATUS_MATCHERS_H_

#include <ostream>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pagealloc::testing {

inline const absl::Status& GetStatus(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// Matches a Status or StatusOr whose code equals `code` and whose message
// matches `message_matcher`.
MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + ::testing::PrintToString(code) +
               " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = ::pagealloc::testing::GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(
             message_matcher, std::string(status.message()), result_listener);
}

// Matches an OK StatusOr whose value matches `value_matcher`.
MATCHER_P(IsOkAndHolds, value_matcher,
          std::string(negation ? "is not OK or holds a value that does not "
                                 "match "
                               : "is OK and holds a value that matches ") +
              ::testing::PrintToString(value_matcher)) {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = ::pagealloc::testing::GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.ok();
}

}  // namespace pagealloc::testing

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::pagealloc::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::pagealloc::testing::IsOk())

#define PAGEALLOC_MATCHERS_CONCAT_INNER_(a, b) a##b
#define PAGEALLOC_MATCHERS_CONCAT_(a, b) PAGEALLOC_MATCHERS_CONCAT_INNER_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  PAGEALLOC_ASSERT_OK_AND_ASSIGN_IMPL_(  \
      PAGEALLOC_MATCHERS_CONCAT_(pagealloc_statusor_, __LINE__), lhs, rexpr)
#define PAGEALLOC_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                         \
  ASSERT_TRUE(statusor.ok()) << statusor.status();                 \
  lhs = std::move(statusor).value()

#endif  // PAGEALLOC_TESTS_STATUS_MATCHERS_H_
