// The settings toolkit: how a backend reads its "<backend>.*" keys of
// AgentSetup::settings, in one wording for every backend: integers in
// range, durations in milliseconds, switches, lists of known names, a host
// given as an IP literal or a network interface, and the error for a key
// the backend does not know.
//
// Used by backends/tensorpipe, backends/grpc, backends/faulty and
// backends/libfabric, each through a SettingsTable: the keys it knows, each
// with the reader of its value (int_into, ms_into, ... below, or its own).
// Every error is INVALID_ARGUMENT and names the key and the value.
//
// Thread safety: the functions are pure (interface_address reads the
// system's interface list).
#ifndef TETHER_BACKENDS_COMMON_SETTINGS_TOOLKIT_H_
#define TETHER_BACKENDS_COMMON_SETTINGS_TOOLKIT_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <absl/time/time.h>
#include <absl/types/span.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tether::backends::common {

// "setting <key>: '<value>' is not <expected>".
absl::Status bad_value(absl::string_view key, absl::string_view value,
                       absl::string_view expected);

// An integer in [min, max].
[[nodiscard]] absl::StatusOr<int64_t> parse_int(absl::string_view key,
                                                absl::string_view value,
                                                int64_t min, int64_t max);

// A duration given in whole milliseconds, in [min_ms, max_ms].
[[nodiscard]] absl::StatusOr<absl::Duration> parse_milliseconds(
    absl::string_view key, absl::string_view value, int64_t min_ms,
    int64_t max_ms = int64_t{1} << 31);

// on/true/1 or off/false/0, in any case.
[[nodiscard]] absl::StatusOr<bool> parse_switch(absl::string_view key,
                                                absl::string_view value);

// A comma-separated list of names out of `known`, duplicates dropped, in
// the given order; at least one.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> parse_list(
    absl::string_view key, absl::string_view value,
    const std::vector<std::string>& known);

// An IP literal as is (IPv6 in brackets), or the address of the network
// interface `value` names (tether::interface_address, core/host_address.h).
[[nodiscard]] absl::StatusOr<std::string> resolve_host(
    absl::string_view key, const std::string& value);

// "unknown setting '<key>'; the <backend> backend knows <known...>".
absl::Status unknown_setting(absl::string_view key, absl::string_view backend,
                             absl::Span<const absl::string_view> known);

// The keys a backend knows, each with the reader of its value into
// `Target` (the backend's settings, or what it gathers them in):
//
//   static const auto* const kTable = new SettingsTable<Settings>(
//       "foo", {{"foo.threads", int_into(&Settings::threads, 1, 64)},
//               {"foo.timeout_ms", ms_into(&Settings::timeout, 1)}});
//   Settings settings;
//   absl::Status read = kTable->read(raw, settings);
//
// read() gives each "<backend>.*" key of `raw` to its reader and stops at
// the first error, or at a key the table does not know (unknown_setting(),
// naming the table's keys in its order); other backends' keys are left
// alone.
template <typename Target>
class SettingsTable {
 public:
  // Reads `value` of `key` into `target`, or says what is wrong with it.
  using Reader = std::function<absl::Status(
      absl::string_view key, const std::string& value, Target& target)>;
  struct Entry {
    absl::string_view key;  // the whole key: "<backend>.<name>"
    Reader read;
  };

  SettingsTable(absl::string_view backend, std::vector<Entry> entries)
      : backend_(backend),
        prefix_(absl::StrCat(backend, ".")),
        entries_(std::move(entries)) {
    for (const Entry& entry : entries_) known_.push_back(entry.key);
  }

  [[nodiscard]] absl::Status read(
      const absl::flat_hash_map<std::string, std::string>& raw,
      Target& target) const {
    for (const auto& [key, value] : raw) {
      if (!absl::StartsWith(key, prefix_)) continue;  // another backend's
      const Entry* entry = find(key);
      if (entry == nullptr) return unknown_setting(key, backend_, known_);
      if (absl::Status read = entry->read(key, value, target); !read.ok()) {
        return read;
      }
    }
    return absl::OkStatus();
  }

 private:
  const Entry* find(absl::string_view key) const {
    for (const Entry& entry : entries_) {
      if (entry.key == key) return &entry;
    }
    return nullptr;
  }

  std::string backend_;
  std::string prefix_;
  std::vector<Entry> entries_;
  std::vector<absl::string_view> known_;
};

// Readers for a SettingsTable, into the member `field` of the target (of
// its base class, too): they take any target, so that one reader serves
// tables of different targets.

// parse_int(), into an integer field.
template <typename Field>
auto int_into(Field field, int64_t min, int64_t max) {
  return [field, min, max](absl::string_view key, const std::string& value,
                           auto& target) -> absl::Status {
    absl::StatusOr<int64_t> number = parse_int(key, value, min, max);
    if (!number.ok()) return number.status();
    using T = std::remove_reference_t<decltype(target.*field)>;
    target.*field = static_cast<T>(*number);
    return absl::OkStatus();
  };
}

// parse_milliseconds(), into an absl::Duration field.
template <typename Field>
auto ms_into(Field field, int64_t min_ms, int64_t max_ms = int64_t{1} << 31) {
  return
      [field, min_ms, max_ms](absl::string_view key, const std::string& value,
                              auto& target) -> absl::Status {
        absl::StatusOr<absl::Duration> duration =
            parse_milliseconds(key, value, min_ms, max_ms);
        if (!duration.ok()) return duration.status();
        target.*field = *duration;
        return absl::OkStatus();
      };
}

// parse_int() of microseconds, into an absl::Duration field.
template <typename Field>
auto us_into(Field field, int64_t min_us, int64_t max_us) {
  return [field, min_us, max_us](absl::string_view key,
                                 const std::string& value,
                                 auto& target) -> absl::Status {
    absl::StatusOr<int64_t> us = parse_int(key, value, min_us, max_us);
    if (!us.ok()) return us.status();
    target.*field = absl::Microseconds(*us);
    return absl::OkStatus();
  };
}

// parse_list() of `known`, into a std::vector<std::string> field.
template <typename Field>
auto list_into(Field field, std::vector<std::string> known) {
  return [field, known = std::move(known)](absl::string_view key,
                                           const std::string& value,
                                           auto& target) -> absl::Status {
    absl::StatusOr<std::vector<std::string>> names =
        parse_list(key, value, known);
    if (!names.ok()) return names.status();
    target.*field = *std::move(names);
    return absl::OkStatus();
  };
}

// resolve_host(), into a std::string field.
template <typename Field>
auto host_into(Field field) {
  return [field](absl::string_view key, const std::string& value,
                 auto& target) -> absl::Status {
    absl::StatusOr<std::string> host = resolve_host(key, value);
    if (!host.ok()) return host.status();
    target.*field = *std::move(host);
    return absl::OkStatus();
  };
}

// The value as it is, into a std::string field.
template <typename Field>
auto text_into(Field field) {
  return [field](absl::string_view, const std::string& value,
                 auto& target) -> absl::Status {
    target.*field = value;
    return absl::OkStatus();
  };
}

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_SETTINGS_TOOLKIT_H_
