// Flat JSON objects of numbers and strings, and the `JSON {...}` line the
// bench CLI (tools/bench.py) reads from the benchmark tools
// (tools/bench_worker.cc, tools/scale_worker.cc).
#ifndef TETHER_TOOLS_INTERNAL_JSON_H_
#define TETHER_TOOLS_INTERNAL_JSON_H_

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/string_view.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace tether::bench {

// `s` quoted; control characters become spaces (one line per object).
inline std::string json_string(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string json_number(double v) {
  return std::isfinite(v) ? absl::StrCat(v) : "null";
}

class JsonObject {
 public:
  void number(absl::string_view key, double v) { add(key, json_number(v)); }
  void string(absl::string_view key, absl::string_view v) {
    add(key, json_string(v));
  }
  void integer(absl::string_view key, int64_t v) { add(key, absl::StrCat(v)); }
  void raw(absl::string_view key, std::string json) {
    add(key, std::move(json));
  }
  std::string str() const {
    return absl::StrCat("{", absl::StrJoin(fields_, ", "), "}");
  }

 private:
  void add(absl::string_view key, std::string value) {
    fields_.push_back(absl::StrCat(json_string(key), ": ", value));
  }
  std::vector<std::string> fields_;
};

// Prints `JSON {...}` on one line and flushes.
inline void print_json(const JsonObject& o) {
  std::printf("JSON %s\n", o.str().c_str());
  std::fflush(stdout);
}

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_JSON_H_
