// What every backend's corpus generator (make_*_corpus.cc, run by hand to
// write the seed inputs of a fuzz target's corpus) shares: the command
// line, writing one input, storages and the small call most seeds carry.
// Each generator keeps only its own input format and its frames.
//
// Thread safety: none needed (a generator is one thread).
#ifndef TETHER_BACKENDS_COMMON_FUZZ_CORPUS_H_
#define TETHER_BACKENDS_COMMON_FUZZ_CORPUS_H_

#include <c10/core/Storage.h>

#include <cstddef>
#include <functional>
#include <string>

#include "core/message.h"

namespace tether::backends::common {

// A CPU storage of `bytes` bytes, not resizable.
c10::Storage corpus_storage(size_t bytes);

// The call most seeds start from: kCall, id 7, payload "a small call",
// storages of 8 and 0 bytes.
Message corpus_small_call();

// The directory the seeds go to.
class CorpusDir {
 public:
  explicit CorpusDir(std::string path) : path_(std::move(path)) {}

  // Writes `input` as the file `name` in the directory.
  void write(const std::string& name, const std::string& input) const;

 private:
  std::string path_;
};

// A generator's main: `program DIR` runs `write_seeds` with DIR and returns
// 0; any other command line prints the usage and returns 2.
int corpus_main(int argc, char** argv, const char* program,
                const std::function<void(const CorpusDir&)>& write_seeds);

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_FUZZ_CORPUS_H_
