// Runs every fuzz target (fuzz_targets.h) without libFuzzer: over its seeds
// (seeds.cc), the files of corpus/<target>/ and regressions/<target>/ (once
// each: inputs that once crashed stay fixed), and a bounded number of
// deterministic random mutations of the seeds, so every CI run exercises the
// decoders with hostile input.
//
// Usage: wire_fuzz_replay [ITERATIONS [FUZZ_DIR]]. ITERATIONS (default
// 200000) are spread over the targets (the slower store targets get a small
// share, Target::replay_share); FUZZ_DIR defaults to this source folder.
// Prints per target what ran, then "N passed, 0 failed" (a failure aborts).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz_targets.h"

#ifndef FERRY_FUZZ_DIR
#define FERRY_FUZZ_DIR "tests/fuzz"
#endif

namespace {

// The files of `dir` (none if it does not exist), in name order.
std::vector<std::pair<std::string, std::string>> Files(const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string().front() == '.') continue;
    if (e.path().extension() == ".md" || e.path().extension() == ".txt")
      continue;  // notes about the inputs
    std::ifstream in(e.path(), std::ios::binary);
    out.emplace_back(e.path().string(), std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Mutate(std::mt19937_64& rng, std::string& m) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 4) {
      case 0:  // flip a byte (not the selector)
        if (m.size() > 1) m[1 + rng() % (m.size() - 1)] = static_cast<char>(rng());
        break;
      case 1:  // truncate
        if (m.size() > 1) m.resize(1 + rng() % (m.size() - 1));
        break;
      case 2:  // append junk
        m.append(rng() % 16, static_cast<char>(rng()));
        break;
      case 3:  // set a length-ish byte to a large value
        if (m.size() > 2) m[1 + rng() % (m.size() - 1)] = static_cast<char>(0xff);
        break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 200000;
  const std::filesystem::path dir = argc > 2 ? argv[2] : FERRY_FUZZ_DIR;
  if (iterations < 0) {
    std::fprintf(stderr, "usage: %s [ITERATIONS [FUZZ_DIR]]\n", argv[0]);
    return 2;
  }
  const auto& targets = ferry::fuzz::Targets();
  std::mt19937_64 rng(12345);
  long runs = 0;
  for (const auto& t : targets) {
    const auto seeds = ferry::fuzz::Seeds(t.name);
    long files = 0;
    for (const auto& s : seeds) t.run(s);
    for (const char* kind : {"corpus", "regressions"}) {
      for (const auto& [path, bytes] : Files(dir / kind / t.name)) {
        t.run(bytes);
        ++files;
      }
    }
    const long mutations =
        seeds.empty() ? 0 : iterations * t.replay_share / 1000 / static_cast<long>(targets.size());
    for (long i = 0; i < mutations; ++i) {
      std::string m = seeds[rng() % seeds.size()];
      Mutate(rng, m);
      t.run(m);
    }
    std::printf("wire_fuzz_replay: %s: %zu seeds, %ld corpus/regression files, %ld mutations\n",
                t.name, seeds.size(), files, mutations);
    runs += static_cast<long>(seeds.size()) + files + mutations;
  }
  std::printf("wire_fuzz_replay: %ld passed, 0 failed\n", runs);
  return 0;
}
