#include "testing/process_resources.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace tether::testing {
namespace {

// The st column of /proc/net/tcp for LISTEN.
constexpr char kListenState[] = "0A";

// Calls `visit` with each open descriptor's number (as /proc names it) and
// what it refers to ("socket:[1234]", a path...).
void for_each_fd(
    const std::function<void(const char* fd, const char* target)>& visit) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    char target[256];
    const std::string link = absl::StrCat("/proc/self/fd/", entry->d_name);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    visit(entry->d_name, target);
  }
  ::closedir(dir);
}

// Inodes of the sockets this process's descriptors refer to.
absl::flat_hash_set<uint64_t> own_socket_inodes() {
  absl::flat_hash_set<uint64_t> inodes;
  for_each_fd([&inodes](const char*, const char* target) {
    uint64_t inode = 0;
    if (std::sscanf(target, "socket:[%lu]", &inode) == 1) inodes.insert(inode);
  });
  return inodes;
}

// "0100007F:1F90" (IPv4) or 32 hex digits and a port (IPv6), as
// /proc/net/tcp{,6} print them.
bool parse_address(const std::string& text, bool ipv6, ListeningAddress& out) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  uint32_t port = 0;
  if (!absl::SimpleHexAtoi(text.substr(colon + 1), &port)) return false;
  const std::string hex = text.substr(0, colon);
  out.port = static_cast<int>(port);
  // The address in network order, printed as host-order (little-endian)
  // 32-bit words.
  uint8_t raw[16];
  const size_t words = ipv6 ? 4 : 1;
  if (hex.size() != 8 * words) return false;
  for (size_t w = 0; w < words; ++w) {
    uint32_t word = 0;
    if (!absl::SimpleHexAtoi(hex.substr(8 * w, 8), &word)) return false;
    std::memcpy(raw + 4 * w, &word, 4);
  }
  in6_addr v6;
  std::memcpy(&v6, raw, sizeof(v6));
  const uint8_t* v4 = raw;
  if (ipv6 && IN6_IS_ADDR_V4MAPPED(&v6)) {
    ipv6 = false;  // a dual-stack socket bound to an IPv4 address
    v4 = raw + 12;
  }
  out.ipv6 = ipv6;
  if (!ipv6) {
    const bool any = v4[0] == 0 && v4[1] == 0 && v4[2] == 0 && v4[3] == 0;
    out.host = any ? "127.0.0.1"
                   : absl::StrCat(v4[0], ".", v4[1], ".", v4[2], ".", v4[3]);
    return true;
  }
  if (IN6_IS_ADDR_UNSPECIFIED(&v6)) {
    out.host = "::1";
    return true;
  }
  char printed[INET6_ADDRSTRLEN] = {0};
  if (::inet_ntop(AF_INET6, &v6, printed, sizeof(printed)) == nullptr) {
    return false;
  }
  out.host = printed;
  return true;
}

// The TCP states of /proc/net/tcp, by their hex code.
const char* tcp_state_name(const std::string& code) {
  static const char* const kNames[] = {
      "?",          "ESTABLISHED", "SYN_SENT",   "SYN_RECV",
      "FIN_WAIT1",  "FIN_WAIT2",   "TIME_WAIT",  "CLOSE",
      "CLOSE_WAIT", "LAST_ACK",    "LISTEN",     "CLOSING"};
  uint32_t value = 0;
  if (!absl::SimpleHexAtoi(code, &value) || value >= 12) return "?";
  return kNames[value];
}

}  // namespace

int64_t status_kb(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::atoll(line.c_str() + std::strlen(field));
    }
  }
  return -1;
}

int64_t rss_anon_kb() { return status_kb("RssAnon:"); }

int64_t malloc_in_use_kb() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>((info.uordblks + info.hblkhd) / 1024);
}

int thread_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

int open_fd_count() {
  int n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
  ::closedir(dir);
  return n - 1;  // the directory's own descriptor
}

std::string describe_open_fds() {
  // Socket inode -> "tcp STATE local -> remote".
  absl::flat_hash_map<uint64_t, std::string> tcp;
  for (const char* table_path : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream table(table_path);
    std::string line;
    std::getline(table, line);
    while (std::getline(table, line)) {
      std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      uint64_t inode = 0;
      if (fields.size() < 10 || !absl::SimpleAtoi(fields[9], &inode)) continue;
      tcp[inode] = absl::StrCat("tcp ", tcp_state_name(fields[3]), " ",
                                fields[1], " -> ", fields[2]);
    }
  }
  std::string out;
  for_each_fd([&tcp, &out](const char* fd, const char* target) {
    absl::StrAppend(&out, fd, " ", target);
    uint64_t inode = 0;
    if (std::sscanf(target, "socket:[%lu]", &inode) == 1) {
      auto it = tcp.find(inode);
      if (it != tcp.end()) absl::StrAppend(&out, " ", it->second);
    }
    out.push_back('\n');
  });
  return out;
}

std::string ListeningAddress::to_string() const {
  return ipv6 ? absl::StrCat("[", host, "]:", port)
              : absl::StrCat(host, ":", port);
}

std::vector<ListeningAddress> listening_tcp_addresses() {
  const absl::flat_hash_set<uint64_t> inodes = own_socket_inodes();
  std::vector<ListeningAddress> out;
  for (const bool ipv6 : {false, true}) {
    std::ifstream table(ipv6 ? "/proc/self/net/tcp6" : "/proc/self/net/tcp");
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
      std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 10 || fields[3] != kListenState) continue;
      uint64_t inode = 0;
      if (!absl::SimpleAtoi(fields[9], &inode) || !inodes.contains(inode)) {
        continue;
      }
      ListeningAddress address;
      if (parse_address(fields[1], ipv6, address)) out.push_back(address);
    }
  }
  return out;
}

}  // namespace tether::testing
