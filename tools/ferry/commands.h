// The `ferry` subcommands. Each takes the arguments after its name and
// returns the process exit status; usage mistakes throw cli::UsageError.
#pragma once

#include <string>
#include <vector>

namespace ferry::cli {

int BenchMain(const std::vector<std::string>& args);
int InfoMain(const std::vector<std::string>& args);
int MetadataServerMain(const std::vector<std::string>& args);

}  // namespace ferry::cli
