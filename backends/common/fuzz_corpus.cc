#include "backends/common/fuzz_corpus.h"

#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <fstream>
#include <utility>

namespace tether::backends::common {

c10::Storage corpus_storage(size_t bytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes,
                      c10::GetCPUAllocator(), /*resizable=*/false);
}

Message corpus_small_call() {
  Message small;
  small.type = MessageType::kCall;
  small.id = 7;
  small.payload = "a small call";
  small.storages = {corpus_storage(8), corpus_storage(0)};
  return small;
}

void CorpusDir::write(const std::string& name, const std::string& input) const {
  std::ofstream(path_ + "/" + name, std::ios::binary) << input;
}

int corpus_main(int argc, char** argv, const char* program,
                const std::function<void(const CorpusDir&)>& write_seeds) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", program);
    return 2;
  }
  write_seeds(CorpusDir(argv[1]));
  return 0;
}

}  // namespace tether::backends::common
