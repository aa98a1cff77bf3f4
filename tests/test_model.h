// A GGUF model opened with its tokenizer, for tests that drive the engine on real models.
#pragma once

#include <memory>
#include <string>

#include "gguf.h"
#include "test_util.h"
#include "tokenizer.h"

namespace kvrun::test {

struct Model {
    GgufFile file;
    std::unique_ptr<Tokenizer> tok;
    explicit Model(const std::string& path) : file(GgufFile::open(path)) {
        tok = Tokenizer::from_gguf(file);
    }
};

// ../shared/models/name opened, or null (after saying why) when it is absent.
inline std::unique_ptr<Model> load_shared_model(const std::string& name) {
    auto path = shared_model(name);
    if (path.empty()) return nullptr;
    return std::make_unique<Model>(path.string());
}

}  // namespace kvrun::test
