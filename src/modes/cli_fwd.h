// The CLI11 classes the option headers name, declared without <CLI/CLI.hpp>: that header
// costs about 10 s of compile time in every file that includes it (its validators are objects
// each file constructs), so only the files that register options include it.
#pragma once

namespace CLI {
class App;
class Validator;
}  // namespace CLI
