// TETHER_CHECK: the assertion for bugs (ours), never for bad input.
//
// Bad input from the wire or the user is a Status; a broken invariant of our
// own is a crash with file and line, so it is found and fixed.
#ifndef TETHER_CORE_TOOLKIT_CHECK_H_
#define TETHER_CORE_TOOLKIT_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define TETHER_CHECK(condition, what)                                     \
  do {                                                                    \
    if (!(condition)) {                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: %s\n", __FILE__,     \
                   __LINE__, #condition, (what));                         \
      std::abort();                                                       \
    }                                                                     \
  } while (false)

#endif  // TETHER_CORE_TOOLKIT_CHECK_H_
