// Writes the seed corpus: corpus/<target>/seed-<n> for every target's seeds
// (seeds.cc, made with the real encoders). Usage: fuzz_make_corpus DIR
// (tests/fuzz/corpus); run after changing an encoder or a seed, commit what
// changed. Old seed files of a target are replaced.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_targets.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  size_t files = 0, bytes = 0;
  for (const auto& t : ferry::fuzz::Targets()) {
    const fs::path dir = fs::path(argv[1]) / t.name;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      std::fprintf(stderr, "fuzz_make_corpus: cannot create %s: %s\n", dir.c_str(),
                   ec.message().c_str());
      return 1;
    }
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().rfind("seed-", 0) == 0) fs::remove(e.path());
    }
    int n = 0;
    for (const std::string& seed : ferry::fuzz::Seeds(t.name)) {
      char name[32];
      std::snprintf(name, sizeof(name), "seed-%02d", n++);
      std::ofstream out(dir / name, std::ios::binary);
      out.write(seed.data(), static_cast<std::streamsize>(seed.size()));
      if (!out) {
        std::fprintf(stderr, "fuzz_make_corpus: cannot write %s\n", (dir / name).c_str());
        return 1;
      }
      ++files;
      bytes += seed.size();
    }
  }
  std::printf("fuzz_make_corpus: %zu targets, %zu files, %zu bytes in %s\n",
              ferry::fuzz::Targets().size(), files, bytes, argv[1]);
  return 0;
}
