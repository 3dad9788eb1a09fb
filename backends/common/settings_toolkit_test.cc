#include "backends/common/settings_toolkit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/status_matchers.h"

namespace tether::backends::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tether::testing::IsOk;
using tether::testing::StatusIs;

TEST(SettingsToolkit, IntegersInRange) {
  EXPECT_THAT(parse_int("x.n", "7", 1, 10), IsOk());
  EXPECT_EQ(*parse_int("x.n", "10", 1, 10), 10);
  EXPECT_THAT(parse_int("x.n", "11", 1, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("setting x.n: '11' is not an integer in "
                                 "[1, 10]")));
  EXPECT_THAT(parse_int("x.n", "seven", 1, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x.n")));
}

TEST(SettingsToolkit, Milliseconds) {
  EXPECT_EQ(*parse_milliseconds("x.t_ms", "250", 1), absl::Milliseconds(250));
  EXPECT_THAT(parse_milliseconds("x.t_ms", "0", 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("setting x.t_ms: '0'")));
}

TEST(SettingsToolkit, Switches) {
  EXPECT_TRUE(*parse_switch("x.s", "ON"));
  EXPECT_FALSE(*parse_switch("x.s", "0"));
  EXPECT_THAT(parse_switch("x.s", "maybe"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not on or off")));
}

TEST(SettingsToolkit, ListsOfKnownNames) {
  EXPECT_THAT(*parse_list("x.l", " b, a,b ", {"a", "b", "c"}),
              ElementsAre("b", "a"));
  EXPECT_THAT(parse_list("x.l", "a,d", {"a", "b"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown name 'd'; known: a, b")));
  EXPECT_THAT(
      parse_list("x.l", " , ", {"a"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("names nothing")));
}

TEST(SettingsToolkit, HostsAreIpLiteralsOrInterfaces) {
  EXPECT_EQ(*resolve_host("x.a", "10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(*resolve_host("x.a", "::1"), "[::1]");
  EXPECT_EQ(*resolve_host("x.a", "lo"), "127.0.0.1");
  EXPECT_THAT(resolve_host("x.a", "no-such-interface0"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("setting x.a: 'no-such-interface0' is "
                                 "neither an IP address nor a usable network "
                                 "interface")));
}

TEST(SettingsToolkit, UnknownKeysNameWhatIsKnown) {
  EXPECT_THAT(unknown_setting("x.zz", "x", {"x.a", "x.b"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown setting 'x.zz'; the x backend knows "
                                 "x.a, x.b")));
}

struct Target {
  int threads = 0;
  absl::Duration timeout;
  std::vector<std::string> names;
  std::string host;
  std::string text;
};

const SettingsTable<Target>& table() {
  static const auto* const kTable = new SettingsTable<Target>(
      "x", {{"x.threads", int_into(&Target::threads, 1, 8)},
            {"x.timeout_ms", ms_into(&Target::timeout, 1)},
            {"x.names", list_into(&Target::names, {"a", "b"})},
            {"x.host", host_into(&Target::host)},
            {"x.text", text_into(&Target::text)}});
  return *kTable;
}

TEST(SettingsToolkit, TablesReadTheirKeysAndRefuseUnknownOnes) {
  Target target;
  EXPECT_THAT(table().read({{"x.threads", "3"},
                            {"x.timeout_ms", "250"},
                            {"x.names", "b,a"},
                            {"x.host", "127.0.0.1"},
                            {"x.text", " as is "},
                            {"y.threads", "lots"}},  // another backend's
                           target),
              IsOk());
  EXPECT_EQ(target.threads, 3);
  EXPECT_EQ(target.timeout, absl::Milliseconds(250));
  EXPECT_THAT(target.names, ElementsAre("b", "a"));
  EXPECT_EQ(target.host, "127.0.0.1");
  EXPECT_EQ(target.text, " as is ");
  EXPECT_THAT(
      table().read({{"x.threads", "9"}}, target),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x.threads")));
  EXPECT_THAT(
      table().read({{"x.thread", "2"}}, target),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("unknown setting 'x.thread'; the x backend knows "
                         "x.threads, x.timeout_ms, x.names, x.host, x.text")));
}

}  // namespace
}  // namespace tether::backends::common
