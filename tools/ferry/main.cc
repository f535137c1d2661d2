// The `ferry` command: ferry bench | info | metadata-server.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"

namespace {

constexpr const char* kHelp = R"(Usage: ferry COMMAND [FLAGS]

Commands:
  bench             measure Ferry against plain sockets and memcpy (no flags: a
                    short standard run on 127.0.0.1)
  info              version, transports, capabilities, wire versions, settings
  metadata-server   a small HTTP key-value metadata service for many engines

Run 'ferry COMMAND --help' for the flags of a command.
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kHelp;
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "bench") return ferry::cli::BenchMain(args);
    if (command == "info") return ferry::cli::InfoMain(args);
    if (command == "metadata-server") return ferry::cli::MetadataServerMain(args);
    if (command == "--version") return ferry::cli::InfoMain({"--version"});
    std::cerr << "ferry: unknown command '" << command
              << "' (commands: bench, info, metadata-server; see ferry --help)\n";
    return 2;
  } catch (const ferry::cli::UsageError& e) {
    std::cerr << "ferry " << command << ": " << e.what() << "\nRun 'ferry " << command
              << " --help' for usage.\n";
    return 2;
  } catch (const ferry::cli::RunError& e) {
    std::cerr << "ferry " << command << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ferry " << command << ": unexpected error: " << e.what() << "\n";
    return 1;
  }
}
