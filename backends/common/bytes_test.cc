#include "backends/common/bytes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "testing/status_matchers.h"

namespace tether::backends::common {
namespace {

using ::testing::HasSubstr;
using tether::testing::IsOk;
using tether::testing::StatusIs;

TEST(Bytes, LittleEndianRoundTrip) {
  std::string out;
  put_le<uint16_t>(out, 0x0102);
  put_le<int32_t>(out, -2);
  put_le<uint64_t>(out, 0x0807060504030201);
  ASSERT_EQ(out.size(), 14u);
  EXPECT_EQ(out.substr(0, 2), std::string("\x02\x01", 2));
  EXPECT_EQ(get_le<uint16_t>(out, 0), 0x0102);
  EXPECT_EQ(get_le<int32_t>(out, 2), -2);
  EXPECT_EQ(get_le<uint64_t>(out, 6), 0x0807060504030201u);

  uint8_t buffer[4];
  uint8_t* at = buffer;
  put_le<uint32_t>(at, 0xa1b2c3d4);
  EXPECT_EQ(at, buffer + 4);
  EXPECT_EQ(buffer[0], 0xd4);
  EXPECT_EQ(get_le<uint32_t>(buffer), 0xa1b2c3d4u);
}

TEST(Bytes, ReaderReadsInOrderAndChecksBounds) {
  std::string frame;
  put_le<uint32_t>(frame, 7);
  put_le<uint32_t>(frame, 3);
  frame += "abc";
  put_le<uint8_t>(frame, 9);
  ByteReader reader(frame, "test frame");
  EXPECT_EQ(*reader.read<uint32_t>("count"), 7u);
  EXPECT_EQ(*reader.read_string("name", 16), "abc");
  EXPECT_THAT(
      reader.expect_end(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("malformed test frame: 1 bytes after the end")));
  EXPECT_THAT(reader.read<uint16_t>("tail"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("malformed test frame: truncated at byte 11: "
                                 "tail needs 2 bytes, 1 left")));
  EXPECT_EQ(*reader.read<uint8_t>("last"), 9);
  EXPECT_THAT(reader.expect_end(), IsOk());
}

TEST(Bytes, ReaderRefusesOversizedStrings) {
  std::string frame;
  put_le<uint32_t>(frame, 1000);
  ByteReader reader(frame, "test frame");
  EXPECT_THAT(reader.read_string("name", 64),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("name of 1000 bytes (at most 64)")));
  EXPECT_THAT(malformed("x frame", "bad magic"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("malformed x frame: bad magic")));
}

}  // namespace
}  // namespace tether::backends::common
