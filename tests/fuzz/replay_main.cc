// A main() for fuzz targets built without libFuzzer (the default gcc build):
// replays every input file named on the command line (or found in a named
// directory), then runs a bounded number of simple mutations of them (bit
// flips, byte changes, truncation, splicing) from a fixed seed. Flags that
// libFuzzer would take ("-max_total_time=...") are ignored, so the same
// command runs either build.

#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Collect(const std::string& path, std::vector<std::string>* inputs) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    DIR* dir = opendir(path.c_str());
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") Collect(path + "/" + name, inputs);
    }
    closedir(dir);
    return;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  inputs->push_back(bytes.str());
}

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()),
                         input.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') Collect(argv[i], &inputs);
  }
  for (const std::string& input : inputs) Run(input);
  const char* runs_env = std::getenv("PAGEALLOC_REPLAY_MUTATIONS");
  const int runs = runs_env != nullptr ? std::atoi(runs_env) : 20000;
  std::mt19937_64 rng(12345);
  for (int run = 0; run < runs && !inputs.empty(); ++run) {
    std::string input = inputs[rng() % inputs.size()];
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:
          if (!input.empty()) input[rng() % input.size()] ^= 1 << (rng() % 8);
          break;
        case 1:
          if (!input.empty()) input[rng() % input.size()] = rng();
          break;
        case 2:
          if (!input.empty()) input.resize(rng() % input.size());
          break;
        default:
          input += inputs[rng() % inputs.size()].substr(0, 16);
          break;
      }
    }
    Run(input);
  }
  std::printf("replayed %zu inputs and %d mutations without a failure\n",
              inputs.size(), runs);
  return 0;
}
