#include "testing/creation_conformance.h"

#include <absl/status/status.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "testing/agent_checks.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::testing {

void ListenerConformance::SetUp() {
  const absl::Status viable = GetParam().traits().backend().viable();
  if (!viable.ok()) {
    GTEST_SKIP() << GetParam().label << " is not viable here: " << viable;
  }
}

std::vector<CreationParam> listeners_only(CreationParam param) {
  if (param.traits().address_key.empty()) return {};
  return {std::move(param)};
}

// Backends that do not listen (loopback) instantiate it with no tests.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ListenerConformance);

namespace {

using ::testing::HasSubstr;

// Settings of the other backends, each with a value its own backend would
// refuse: a backend must not read them.
const std::vector<std::pair<std::string, std::string>>& others_settings() {
  static const auto* const settings =
      new std::vector<std::pair<std::string, std::string>>{
          {"tensorpipe.transports", "carrier_pigeon"},
          {"grpc.tls_cert", "/nowhere"},
          {"libfabric.provider", "carrier_pigeon"},
          {"faulty.fail", "NO_SUCH_TYPE:1"},
      };
  return *settings;
}

TEST_P(CreationConformance, IsNamedAndViableHere) {
  const CreationTraits traits = GetParam().traits();
  const Backend backend = traits.backend();
  EXPECT_EQ(backend.name, traits.name);
  EXPECT_THAT(backend.viable(), IsOk());
}

TEST_P(CreationConformance, BadSettingsAreInvalidArgumentNamingWhatIsWrong) {
  const CreationTraits traits = GetParam().traits();
  const Backend backend = traits.backend();
  for (const BadSetting& bad : traits.bad_settings) {
    const absl::Status status = create_status(backend, {{bad.key, bad.value}});
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument))
        << bad.key << "=" << bad.value;
    const std::vector<std::string> names =
        bad.names.empty() ? std::vector<std::string>{bad.key} : bad.names;
    for (const std::string& name : names) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(name))
          << bad.key << "=" << bad.value;
    }
  }
}

TEST_P(CreationConformance, IgnoresOtherBackendsSettings) {
  const CreationTraits traits = GetParam().traits();
  const Backend backend = traits.backend();
  for (const auto& [key, value] : others_settings()) {
    if (absl::StartsWith(key, absl::StrCat(traits.name, "."))) continue;
    EXPECT_THAT(create_status(backend, {{key, value}}), IsOk())
        << key << "=" << value;
  }
}

TEST_P(ListenerConformance, ListensOnANamedInterface) {
  const CreationTraits traits = GetParam().traits();
  AgentGroup group(traits.backend(), 2, {{traits.address_key, "lo"}});
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  expect_round_trip_with_storages(group[0], group[1].self());
}

TEST_P(ListenerConformance, PublishesItsAddressRecordInTheStore) {
  const CreationTraits traits = GetParam().traits();
  AgentGroup group(traits.backend(), 2);
  ASSERT_TRUE(group.ok());
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<uint8_t> bytes =
        group.store().get(absl::StrCat("tether/", traits.name, "/", rank));
    const std::string record(bytes.begin(), bytes.end());
    for (const std::string& part : traits.address_record) {
      EXPECT_THAT(record, HasSubstr(part)) << "rank " << rank;
    }
  }
}

TEST_P(ListenerConformance, CreationTimesOutNamingMissingRanks) {
  const CreationTraits traits = GetParam().traits();
  ASSERT_FALSE(traits.init_timeout_key.empty());
  AgentGroup group(traits.backend(), 3, {{traits.init_timeout_key, "200"}},
                   /*create=*/{0});
  EXPECT_THAT(group.error(0), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                       HasSubstr("rank(s) 1, 2")));
}

}  // namespace
}  // namespace tether::testing
