// The seed-corpus switch the fuzz targets share: with KVRUN_FUZZ_WRITE_SEEDS=<dir> set, a
// target writes its seeds into <dir> and exits (scripts/fuzz.sh runs each target so once before
// fuzzing it).
#pragma once

#include <cstdlib>

// For LLVMFuzzerInitialize: calls write_seeds(dir) and exits when the variable is set.
template <typename WriteSeeds>
int fuzz_write_seeds_if_asked(WriteSeeds write_seeds) {
    if (const char* dir = std::getenv("KVRUN_FUZZ_WRITE_SEEDS")) {
        write_seeds(dir);
        std::exit(0);
    }
    return 0;
}
