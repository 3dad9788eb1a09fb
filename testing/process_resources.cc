#include "testing/process_resources.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <malloc.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tether::testing {
namespace {

// The st column of /proc/net/tcp for LISTEN.
constexpr char kListenState[] = "0A";

// Calls `visit` with each open descriptor's number (as /proc names it) and
// what it refers to ("socket:[1234]", a path...).
// `dir` is a process's fd directory ("/proc/self/fd", "/proc/<pid>/fd");
// the descriptor this call reads it with is left out.
void for_each_fd(
    const std::string& path,
    const std::function<void(const char* fd, const char* target)>& visit) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return;
  const std::string own = absl::StrCat(::dirfd(dir));
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    if (path == "/proc/self/fd" && own == entry->d_name) continue;
    char target[256];
    const std::string link = absl::StrCat(path, "/", entry->d_name);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    visit(entry->d_name, target);
  }
  ::closedir(dir);
}

// Inodes of the sockets the descriptors of `fd_dir` refer to.
absl::flat_hash_set<uint64_t> socket_inodes(const std::string& fd_dir) {
  absl::flat_hash_set<uint64_t> inodes;
  for_each_fd(fd_dir, [&inodes](const char*, const char* target) {
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
  static const char* const kNames[] = {"?",         "ESTABLISHED", "SYN_SENT",
                                       "SYN_RECV",  "FIN_WAIT1",   "FIN_WAIT2",
                                       "TIME_WAIT", "CLOSE",       "CLOSE_WAIT",
                                       "LAST_ACK",  "LISTEN",      "CLOSING"};
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
  for_each_fd("/proc/self/fd",
              [&tcp, &out](const char* fd, const char* target) {
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
  if (unix_socket) return absl::StrCat("unix:", host);
  return ipv6 ? absl::StrCat("[", host, "]:", port)
              : absl::StrCat(host, ":", port);
}

std::vector<ListeningAddress> listening_sockets(pid_t pid) {
  const std::string proc = absl::StrCat("/proc/", pid);
  const absl::flat_hash_set<uint64_t> inodes = socket_inodes(proc + "/fd");
  // The fields of each line of the table `name` (its header skipped) with
  // at least `min_fields`, whose field `state` is `listening` and whose
  // inode (field `inode`) is one of `pid`'s sockets.
  auto listening_lines = [&](const char* name, size_t min_fields, size_t state,
                             absl::string_view listening, size_t inode) {
    std::vector<std::vector<std::string>> found;
    std::ifstream table(absl::StrCat(proc, "/net/", name));
    std::string line;
    std::getline(table, line);
    while (std::getline(table, line)) {
      std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      uint64_t number = 0;
      if (fields.size() >= min_fields && fields[state] == listening &&
          absl::SimpleAtoi(fields[inode], &number) && inodes.contains(number)) {
        found.push_back(std::move(fields));
      }
    }
    return found;
  };
  std::vector<ListeningAddress> out;
  for (const bool ipv6 : {false, true}) {
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    for (const std::vector<std::string>& fields :
         listening_lines(ipv6 ? "tcp6" : "tcp", 10, 3, kListenState, 9)) {
      ListeningAddress address;
      if (parse_address(fields[1], ipv6, address)) out.push_back(address);
    }
  }
  // Num RefCount Protocol Flags Type St Inode Path; a listening socket's
  // Flags has __SO_ACCEPTCON (00010000).
  for (const std::vector<std::string>& fields :
       listening_lines("unix", 8, 3, "00010000", 6)) {
    ListeningAddress address;
    address.unix_socket = true;
    address.host = fields[7];
    out.push_back(address);
  }
  return out;
}

std::vector<ListeningAddress> listening_tcp_addresses() {
  std::vector<ListeningAddress> out = listening_sockets(::getpid());
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const ListeningAddress& address) {
                             return address.unix_socket;
                           }),
            out.end());
  return out;
}

std::map<int, std::string> open_fds() {
  std::map<int, std::string> files;
  for_each_fd("/proc/self/fd", [&files](const char* fd, const char* target) {
    int number = -1;
    if (absl::SimpleAtoi(fd, &number)) files[number] = target;
  });
  return files;
}

std::string changed_fds(const std::map<int, std::string>& before,
                        const std::map<int, std::string>& after) {
  std::string out;
  for (const auto& [fd, what] : after) {
    auto it = before.find(fd);
    if (it == before.end() || it->second != what) {
      absl::StrAppend(&out, " ", fd, " -> ", what, ";");
    }
  }
  return out.empty() ? " none" : out;
}

}  // namespace tether::testing
