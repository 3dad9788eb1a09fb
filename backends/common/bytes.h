// Bytes on the wire: little-endian integers in and out, a bounds-checked
// reader over a frame, and the one wording of a malformed frame. Every
// backend's framing (tensorpipe, gRPC; libfabric later) and the
// authentication handshake (core/auth/handshake.h) read and write through
// these, so that a truncated or hostile frame is an INVALID_ARGUMENT Status
// that says what and where, never a read past the end.
//
// Thread safety: free functions are pure; a ByteReader is used by one
// thread at a time.
#ifndef TETHER_BACKENDS_COMMON_BYTES_H_
#define TETHER_BACKENDS_COMMON_BYTES_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace tether::backends::common {

// Appends `value` to `out`, least significant byte first.
template <typename T>
void put_le(std::string& out, T value) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  const U bits = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
}

// Writes `value` at `out` and advances it.
template <typename T>
void put_le(uint8_t*& out, T value) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  const U bits = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(T); ++i) {
    *out++ = static_cast<uint8_t>((bits >> (8 * i)) & 0xff);
  }
}

// Reads a T at `in`. WARNING: unchecked; the caller has checked that
// sizeof(T) bytes are there (ByteReader checks).
template <typename T>
T get_le(const uint8_t* in) {
  static_assert(std::is_integral_v<T>);
  using U = std::make_unsigned_t<T>;
  U bits = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    bits |= static_cast<U>(in[i]) << (8 * i);
  }
  return static_cast<T>(bits);
}

template <typename T>
T get_le(absl::string_view in, size_t offset) {
  return get_le<T>(reinterpret_cast<const uint8_t*>(in.data()) + offset);
}

// INVALID_ARGUMENT "malformed <frame>: <what>".
inline absl::Status malformed(absl::string_view frame, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed ", frame, ": ", what));
}

// Reads a frame front to back; every read checks the bytes are there.
class ByteReader {
 public:
  // `frame` names what is read in errors ("tensorpipe frame").
  ByteReader(absl::string_view bytes, absl::string_view frame)
      : bytes_(bytes), frame_(frame) {}

  size_t remaining() const { return bytes_.size() - at_; }
  size_t position() const { return at_; }

  template <typename T>
  [[nodiscard]] absl::StatusOr<T> read(absl::string_view what) {
    if (remaining() < sizeof(T)) return truncated(what, sizeof(T));
    const T value = get_le<T>(bytes_, at_);
    at_ += sizeof(T);
    return value;
  }

  // The next `n` bytes, viewed in place.
  [[nodiscard]] absl::StatusOr<absl::string_view> read_bytes(
      size_t n, absl::string_view what) {
    if (remaining() < n) return truncated(what, n);
    absl::string_view out = bytes_.substr(at_, n);
    at_ += n;
    return out;
  }

  // A length-prefixed (uint32) string of at most `max` bytes.
  [[nodiscard]] absl::StatusOr<std::string> read_string(absl::string_view what,
                                                        uint32_t max) {
    absl::StatusOr<uint32_t> size = read<uint32_t>(what);
    if (!size.ok()) return size.status();
    if (*size > max) {
      return malformed(
          absl::StrCat(what, " of ", *size, " bytes (at most ", max, ")"));
    }
    absl::StatusOr<absl::string_view> bytes = read_bytes(*size, what);
    if (!bytes.ok()) return bytes.status();
    return std::string(*bytes);
  }

  // OK if everything was read, else malformed naming the bytes left over.
  [[nodiscard]] absl::Status expect_end() const {
    if (remaining() == 0) return absl::OkStatus();
    return malformed(absl::StrCat(remaining(), " bytes after the end"));
  }

  // "malformed <frame>: <what>".
  absl::Status malformed(absl::string_view what) const {
    return common::malformed(frame_, what);
  }

 private:
  absl::Status truncated(absl::string_view what, size_t wanted) const {
    return malformed(absl::StrCat("truncated at byte ", at_, ": ", what,
                                  " needs ", wanted, " bytes, ", remaining(),
                                  " left"));
  }

  absl::string_view bytes_;
  std::string frame_;
  size_t at_ = 0;
};

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_BYTES_H_
