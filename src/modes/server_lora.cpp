// llama-server's /lora-adapters (see server_lora.h).
#include "modes/server_lora.h"

#include "modes/request_json.h"

namespace kvrun {

LoraAdapters::LoraAdapters(std::vector<std::string> paths, std::vector<float> loaded)
    : paths_(std::move(paths)), loaded_(std::move(loaded)), current_(loaded_) {
    paths_.resize(loaded_.size());
}

nlohmann::json LoraAdapters::list() const {
    std::lock_guard lock(mu_);
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < current_.size(); ++i)
        out.push_back({{"id", i}, {"path", paths_[i]}, {"scale", current_[i]}});
    return out;
}

void LoraAdapters::set(const nlohmann::json& body) {
    std::vector<float> scales = lora_scales_from_json(body, int32_t(loaded_.size()));
    std::lock_guard lock(mu_);
    current_ = std::move(scales);
}

std::vector<float> LoraAdapters::scales() const {
    std::lock_guard lock(mu_);
    return current_ == loaded_ ? std::vector<float>{} : current_;
}

}  // namespace kvrun
