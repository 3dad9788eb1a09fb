// A small stand-in for libFuzzer's driver, so that every fuzz target also
// runs in the default test suite, built with the default compiler (gcc has no
// -fsanitize=fuzzer): it feeds the target each file of the corpus
// directories given, then --runs=N inputs made by mutating them (bit flips,
// byte changes, truncations, insertions, duplicated runs, splices) from a
// fixed seed, so a failure reproduces. The target aborts on a property it
// finds broken; the driver exits 0 if all inputs passed.
//
//   fuzz_smoke_test CORPUS_DIR... [--runs=N] [--seed=N]
//
// The long, coverage-guided runs use the real libFuzzer (docs/fuzzing.md).
#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> read_corpus(const std::string& dir) {
  std::vector<std::string> inputs;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    std::fprintf(stderr, "fuzz driver: cannot open corpus %s\n", dir.c_str());
    std::exit(2);
  }
  while (dirent* entry = ::readdir(d)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream in(dir + "/" + entry->d_name, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    inputs.push_back(bytes.str());
  }
  ::closedir(d);
  return inputs;
}

std::string mutate(std::string input, const std::vector<std::string>& corpus,
                   std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? 0 : rng() % n; };
  const int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(6)) {
      case 0:  // flip a bit
        if (!input.empty()) input[pick(input.size())] ^= 1 << pick(8);
        break;
      case 1:  // set a byte to an interesting value
        if (!input.empty()) {
          static const uint8_t kValues[] = {0, 1, 0x7f, 0x80, 0xff, 0xfe};
          input[pick(input.size())] = static_cast<char>(kValues[pick(6)]);
        }
        break;
      case 2:  // truncate
        input.resize(pick(input.size() + 1));
        break;
      case 3:  // insert random bytes
        input.insert(pick(input.size() + 1),
                     std::string(1 + pick(8), static_cast<char>(rng())));
        break;
      case 4: {  // duplicate a run
        if (input.empty()) break;
        const size_t from = pick(input.size());
        const size_t len = 1 + pick(std::min<size_t>(16, input.size() - from));
        input.insert(pick(input.size() + 1), input.substr(from, len));
        break;
      }
      case 5: {  // splice with another corpus entry
        const std::string& other = corpus[pick(corpus.size())];
        input = input.substr(0, pick(input.size() + 1)) +
                other.substr(pick(other.size() + 1));
        break;
      }
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 10000;
  uint64_t seed = 1;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--runs=", 7) == 0) {
      runs = std::strtol(argv[i] + 7, nullptr, 10);
    } else if (std::strncmp(argv[i], "--seed=", 7) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else {
      for (std::string& input : read_corpus(argv[i])) {
        corpus.push_back(std::move(input));
      }
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "fuzz driver: empty corpus\n");
    return 2;
  }
  for (const std::string& input : corpus) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()),
                           input.size());
  }
  std::mt19937_64 rng(seed);
  for (long i = 0; i < runs; ++i) {
    const std::string input =
        mutate(corpus[rng() % corpus.size()], corpus, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()),
                           input.size());
  }
  std::printf("fuzz driver: %zu corpus inputs and %ld mutations passed "
              "(seed %llu)\n",
              corpus.size(), runs, static_cast<unsigned long long>(seed));
  return 0;
}
