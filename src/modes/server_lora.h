// llama-server's /lora-adapters: GET lists the loaded LoRA adapters with the scales requests
// get when they give no "lora" of their own; POST [{"id", "scale"}, ...] sets those scales
// (an adapter left out gets 0, as a request's "lora" does). Thread-safe: the server's
// connections read and write it at once.
#pragma once

#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvrun {

class LoraAdapters {
  public:
    // `paths`: the adapters in id order (--lora, then --lora-scaled); `loaded`: their scales
    // as loaded (Backend::lora_scales), which requests start with.
    LoraAdapters(std::vector<std::string> paths, std::vector<float> loaded);
    // [{"id", "path", "scale"}, ...] with the current scales.
    nlohmann::json list() const;
    // POST's body: a list as a request's "lora" (lora_scales_from_json). Throws Error for a
    // malformed one, naming what is wrong; nothing changes then.
    void set(const nlohmann::json& body);
    // The scales for a request without "lora": empty while they are the loaded ones (the
    // backend's own), else one per adapter.
    std::vector<float> scales() const;

  private:
    mutable std::mutex mu_;
    std::vector<std::string> paths_;
    std::vector<float> loaded_, current_;
};

}  // namespace kvrun
