// `ferry metadata-server` for the metadata tests of a build without the
// `ferry` command (the sanitizer builds of scripts/run-tests.sh): the same
// server code (tools/ferry/metadata_server.cc), so it runs under the
// sanitizer with the engines that talk to it. Takes the same arguments as
// the command: metadata-server --port N [--listen HOST] [--ttl-ms T].
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "tools/ferry/cli.h"
#include "tools/ferry/commands.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] != "metadata-server") {
    std::cerr << "usage: " << argv[0] << " metadata-server --port N [--listen HOST] [--ttl-ms T]\n";
    return 2;
  }
  args.erase(args.begin());
  try {
    return ferry::cli::MetadataServerMain(args);
  } catch (const ferry::cli::UsageError& e) {
    std::cerr << "metadata-server: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "metadata-server: " << e.what() << "\n";
    return 1;
  }
}
