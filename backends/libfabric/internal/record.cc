#include "backends/libfabric/internal/record.h"

#include <absl/strings/escaping.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <fstream>
#include <utility>

#include "backends/libfabric/internal/framing.h"

namespace tether::backends::libfabric::internal {

namespace framing = libfabric::internal;

std::string encode_record(const Record& record) {
  return absl::StrCat(
      "provider=", record.provider, "\naddress=",
      absl::BytesToHexString(record.address), "\nbuffer=", record.buffer_size,
      "\ncredits=", record.credits, "\nrendezvous=",
      rendezvous_mode_name(record.mode), "\npid=", record.pid,
      "\nhost=", record.host, "\ndoorbell=",
      absl::BytesToHexString(record.doorbell), "\nname=",
      absl::BytesToHexString(record.name), "\n");
}

absl::StatusOr<std::optional<Endpoint>> endpoint_in_record(
    const Record& record) {
  // "tcp;ofi_rxm": the core provider is the first one.
  const absl::string_view core =
      absl::string_view(record.provider).substr(0, record.provider.find(';'));
  if (core != "tcp" && core != "sockets" && core != "udp") {
    return std::optional<Endpoint>();
  }
  const std::string& name = record.address;
  sa_family_t family = AF_UNSPEC;
  if (name.size() >= sizeof(family)) {
    std::memcpy(&family, name.data(), sizeof(family));
  }
  char ip[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (family == AF_INET && name.size() >= sizeof(sockaddr_in)) {
    sockaddr_in in;
    std::memcpy(&in, name.data(), sizeof(in));
    ::inet_ntop(AF_INET, &in.sin_addr, ip, sizeof(ip));
    port = ntohs(in.sin_port);
  } else if (family == AF_INET6 && name.size() >= sizeof(sockaddr_in6)) {
    sockaddr_in6 in6;
    std::memcpy(&in6, name.data(), sizeof(in6));
    ::inet_ntop(AF_INET6, &in6.sin6_addr, ip, sizeof(ip));
    port = ntohs(in6.sin6_port);
  }
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "the libfabric address of provider '", record.provider, "' (",
        name.size(), " bytes, family ", family,
        ") is not an IPv4 or IPv6 socket address with a port"));
  }
  return std::optional<Endpoint>(Endpoint{ip, port});
}

absl::StatusOr<Record> decode_record(absl::string_view text) {
  Record record;
  int fields = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> entry =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    const absl::string_view key = entry.first;
    const absl::string_view value = entry.second;
    bool ok = true;
    if (key == "provider") {
      record.provider = std::string(value);
    } else if (key == "address") {
      record.address = absl::HexStringToBytes(value);
      ok = value.size() % 2 == 0 && !record.address.empty();
    } else if (key == "buffer") {
      ok = absl::SimpleAtoi(value, &record.buffer_size) &&
           record.buffer_size >= framing::kHeaderSize + framing::kMessageHeadSize;
    } else if (key == "credits") {
      ok = absl::SimpleAtoi(value, &record.credits) && record.credits > 0;
    } else if (key == "rendezvous") {
      ok = value == "read" || value == "tagged";
      record.mode =
          value == "read" ? RendezvousMode::kRead : RendezvousMode::kTagged;
    } else if (key == "pid") {
      ok = absl::SimpleAtoi(value, &record.pid);
    } else if (key == "host") {
      record.host = std::string(value);
    } else if (key == "doorbell") {
      record.doorbell = absl::HexStringToBytes(value);
      ok = value.size() % 2 == 0 &&
           record.doorbell.size() <= sizeof(sockaddr_un::sun_path);
      --fields;  // optional
    } else if (key == "name") {
      record.name = absl::HexStringToBytes(value);
      ok = value.size() % 2 == 0;
      --fields;  // optional
    } else {
      continue;  // a later version's field
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad field '", key, "' in a libfabric address record"));
    }
    ++fields;
  }
  if (fields < 7) {
    return absl::InvalidArgumentError("incomplete libfabric address record");
  }
  return record;
}

std::string host_identity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string identity;
  std::getline(boot, identity);
  if (identity.empty()) return "";
  for (const char* ns : {"/proc/self/ns/pid", "/proc/self/ns/net"}) {
    char link[128];
    const ssize_t length = ::readlink(ns, link, sizeof(link));
    if (length <= 0) return "";
    absl::StrAppend(&identity, "/", absl::string_view(link, length));
  }
  return identity;
}

}  // namespace tether::backends::libfabric::internal
