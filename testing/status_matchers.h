// gMock matchers for absl::Status and absl::StatusOr, for every test.
//
//   EXPECT_THAT(worker->shutdown(), IsOk());
//   EXPECT_THAT(result, StatusIs(absl::StatusCode::kNotFound,
//                                HasSubstr("no_such_op")));
#ifndef TETHER_TESTING_STATUS_MATCHERS_H_
#define TETHER_TESTING_STATUS_MATCHERS_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <gmock/gmock.h>

#include <ostream>

namespace tether::testing {

namespace internal {

inline const absl::Status& get_status(const absl::Status& status) {
  return status;
}

template <typename T>
const absl::Status& get_status(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace internal

MATCHER(IsOk, "is OK") {
  const absl::Status& status = internal::get_status(arg);
  if (!status.ok()) *result_listener << "which is " << status;
  return status.ok();
}

MATCHER_P(StatusIs, code, "has status code " + ::testing::PrintToString(code)) {
  const absl::Status& status = internal::get_status(arg);
  *result_listener << "which is " << status;
  return status.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has status code " + ::testing::PrintToString(code) +
               " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = internal::get_status(arg);
  *result_listener << "which is " << status;
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

}  // namespace tether::testing

#endif  // TETHER_TESTING_STATUS_MATCHERS_H_
