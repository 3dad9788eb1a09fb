// What a test process holds, read from /proc and malloc: open file
// descriptors, private memory, threads, and the TCP ports it listens on.
//
// For tests that check a worker gives back what it took (the soak test,
// the hostile-peer suite): a count taken before and after must match.
// Linux only (/proc); each call reads the kernel's view afresh.
#ifndef TETHER_TESTING_PROCESS_RESOURCES_H_
#define TETHER_TESTING_PROCESS_RESOURCES_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tether::testing {

// A field of /proc/self/status in kB ("RssAnon:", "RssShmem:"), or -1.
// RssAnon is the process's own memory (heap, stacks).
int64_t status_kb(const char* field);

// RssAnon in kB.
int64_t rss_anon_kb();

// Bytes malloc has handed out and not had back (its arenas and mmapped
// chunks), in kB: tells growth of the heap from other private mappings.
int64_t malloc_in_use_kb();

// Threads of this process.
int thread_count();

// Open file descriptors of this process (the one this call opens to count
// them is not counted).
int open_fd_count();

// One line per open descriptor: its number and what it refers to, and for a
// TCP socket its state and addresses as /proc/self/net/tcp{,6} show them
// ("7 socket:[1234] tcp CLOSE_WAIT 0100007F:AEBF -> 0100007F:D3A2"). For
// failure messages that must say what was left open.
std::string describe_open_fds();

// A socket a process listens on: what a client connects to.
struct ListeningAddress {
  // "127.0.0.1" or "::1" for a wildcard listener; a unix socket's path
  // ('@' first: an abstract one).
  std::string host;
  int port = 0;
  bool ipv6 = false;
  bool unix_socket = false;

  // "127.0.0.1:port", "[::1]:port" or "unix:path".
  std::string to_string() const;
};

// Every TCP socket in LISTEN state that one of this process's descriptors
// refers to (/proc/self/net/tcp{,6} matched with /proc/self/fd by inode),
// whichever library opened it. A wildcard address is reported as loopback.
std::vector<ListeningAddress> listening_tcp_addresses();

// Every socket process `pid` listens on, TCP (IPv4, IPv6) and unix, the
// same way (/proc/<pid>/fd matched with /proc/<pid>/net/{tcp,tcp6,unix}).
std::vector<ListeningAddress> listening_sockets(pid_t pid);

// This process's open descriptors: what each refers to ("socket:[1234]",
// a path), the one this call opens to read them left out.
std::map<int, std::string> open_fds();

// The descriptors of `after` that are not in `before` as they were
// (" 7 -> socket:[1234]; ..."), or " none": for failure messages.
std::string changed_fds(const std::map<int, std::string>& before,
                        const std::map<int, std::string>& after);

}  // namespace tether::testing

#endif  // TETHER_TESTING_PROCESS_RESOURCES_H_
