// The creation-and-settings area of the conformance suite: what every
// backend's factory does the same way (core/backend_registry.h).
//
// CreationConformance, every backend: the backend has its name and is
// viable here; each of its bad settings fails creation with
// INVALID_ARGUMENT naming what was wrong; settings of the other backends
// are left alone. ListenerConformance, the backends that listen (traits
// with an address_key): a setting names the interface to listen on; each
// agent publishes its address record in the group's store under
// "tether/<name>/<rank>"; creation gives up after the init timeout, naming
// the ranks that never came.
//
// Linked once per backend as a one-line test, with the traits that say
// where the backend differs:
//
//   // backends/foo/foo_creation_test.cc
//   tether::testing::CreationTraits foo_traits() {
//     return tether::testing::CreationTraits::of("foo", foo_backend)
//         .reject("threads", {"0", "lots"})
//         .reject("treads", {"2"});  // a typo of a known key
//   }
//   TETHER_CREATION_CONFORMANCE_TEST(Foo, foo_traits());
#ifndef TETHER_TESTING_CREATION_CONFORMANCE_H_
#define TETHER_TESTING_CREATION_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/backend_registry.h"

namespace tether::testing {

// A setting that must fail creation with INVALID_ARGUMENT, and what the
// error must name (every string of `names`; the key when it is empty).
struct BadSetting {
  std::string key;
  std::string value;
  std::vector<std::string> names;
};

// Where a backend differs in this area.
struct CreationTraits {
  // The backend under test, and the name it must carry.
  std::function<Backend()> backend;
  std::string name;

  std::vector<BadSetting> bad_settings;

  // For a backend that listens: its setting of the interface to listen on
  // (the suite names "lo"), of its creation timeout in milliseconds, and
  // what its address record must contain. An empty address_key: it does
  // not listen.
  std::string address_key;
  std::string init_timeout_key;
  std::vector<std::string> address_record;

  // A backend that does not listen.
  static CreationTraits of(std::string name, std::function<Backend()> backend) {
    CreationTraits traits;
    traits.backend = std::move(backend);
    traits.name = std::move(name);
    return traits;
  }

  // A backend that listens, with its keys named the common way:
  // "<name>.address" and "<name>.init_timeout_ms".
  static CreationTraits listener(std::string name,
                                 std::function<Backend()> backend,
                                 std::vector<std::string> address_record) {
    CreationTraits traits = of(std::move(name), std::move(backend));
    traits.address_key = traits.name + ".address";
    traits.init_timeout_key = traits.name + ".init_timeout_ms";
    traits.address_record = std::move(address_record);
    return traits;
  }

  // Bad settings of the key "<name>.<key>", one for each of `values`: each
  // must fail creation naming the key.
  CreationTraits& reject(const std::string& key,
                         const std::vector<std::string>& values) {
    for (const std::string& value : values) {
      bad_settings.push_back({name + "." + key, value, {}});
    }
    return *this;
  }

  // A bad setting of "<name>.<key>" whose error must name each of `names`
  // (the missing key it needs, the known key a typo resembles, the bad
  // part of the value).
  CreationTraits& reject(const std::string& key, std::string value,
                         std::vector<std::string> names) {
    bad_settings.push_back(
        {name + "." + key, std::move(value), std::move(names)});
    return *this;
  }
};

// The parameter of both suites.
struct CreationParam {
  std::string label;
  std::function<CreationTraits()> traits;

  friend void PrintTo(const CreationParam& param, std::ostream* out) {
    *out << param.label;
  }
};

class CreationConformance : public ::testing::TestWithParam<CreationParam> {};

// Skips every test, saying why, when the backend is not viable here.
class ListenerConformance : public ::testing::TestWithParam<CreationParam> {
 protected:
  void SetUp() override;
};

// `param` alone if its backend listens, else nothing.
std::vector<CreationParam> listeners_only(CreationParam param);

}  // namespace tether::testing

#define TETHER_CREATION_CONFORMANCE_TEST(suite, traits_expr)                   \
  namespace tether::testing {                                                  \
  INSTANTIATE_TEST_SUITE_P(suite, CreationConformance,                         \
                           ::testing::Values(CreationParam{                    \
                               #suite, [] { return (traits_expr); }}),         \
                           [](const auto& info) { return info.param.label; }); \
  INSTANTIATE_TEST_SUITE_P(suite, ListenerConformance,                         \
                           ::testing::ValuesIn(listeners_only(CreationParam{   \
                               #suite, [] { return (traits_expr); }})),        \
                           [](const auto& info) { return info.param.label; }); \
  }  // namespace tether::testing

#endif  // TETHER_TESTING_CREATION_CONFORMANCE_H_
