// llama-server's slot persistence (see server_slots.h).
#include "modes/server_slots.h"

#include <fmt/core.h>

#include <chrono>
#include <filesystem>

#include "common.h"
#include "modes/server_api.h"
#include "text_input.h"

namespace kvrun {

bool slot_filename_ok(std::string_view name) {
    if (name.empty() || name.size() > 255 || name == "." || name == ".." || name[0] == '.')
        return false;
    if (utf8_find_invalid(name) != std::string_view::npos) return false;
    for (const char c : name)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '/' || c == '\\' || c == ':')
            return false;
    return true;
}

ServerSlots::ServerSlots(int32_t n_slots, std::string save_dir, PromptCacheKey key)
    : slots_(size_t(std::max(n_slots, 1))), dir_(std::move(save_dir)), key_(std::move(key)) {
    std::error_code ec;
    if (!dir_.empty() && !std::filesystem::is_directory(dir_, ec))
        throw Error(fmt::format("--slot-save-path {}: no such directory", dir_),
                    "create it first (mkdir)");
}

int32_t ServerSlots::take(int32_t asked) {
    std::lock_guard lock(mu_);
    if (asked >= int32_t(slots_.size()))
        throw Error(
            fmt::format("'id_slot' {} is not a slot: this server has {} (0 to {}; -1: "
                        "any)",
                        asked, slots_.size(), slots_.size() - 1));
    int32_t s = asked;
    if (s < 0) {
        s = 0;
        for (size_t i = 1; i < slots_.size(); ++i)
            if (slots_[i].used < slots_[size_t(s)].used) s = int32_t(i);
    }
    slots_[size_t(s)].used = ++clock_;
    return s;
}

void ServerSlots::finish(int32_t slot, std::vector<TokenId> tokens,
                         std::span<const TokenId> reply) {
    tokens.insert(tokens.end(), reply.begin(), reply.end());
    std::lock_guard lock(mu_);
    slots_.at(size_t(slot)).tokens = std::move(tokens);
}

std::vector<TokenId> ServerSlots::tokens(int32_t slot) const {
    std::lock_guard lock(mu_);
    return slots_.at(size_t(slot)).tokens;
}

SlotAnswer ServerSlots::action(std::string_view method, std::string_view id, std::string_view query,
                               const std::string& body, EngineWorker& worker, int64_t n_vocab) {
    auto fail = [](int status, std::string message) {
        return SlotAnswer{status, nullptr, std::move(message)};
    };
    if (method != "POST")
        return fail(405, fmt::format("{} is not allowed on /slots/{}", method, id));
    if (dir_.empty())
        return fail(501, "slot actions are off: start the server with --slot-save-path DIR");
    int32_t slot = -1;
    if (!id.empty() && id.size() <= 9 && id.find_first_not_of("0123456789") == id.npos)
        slot = std::stoi(std::string(id));
    if (slot < 0 || slot >= int32_t(slots_.size()))
        return fail(
            400, fmt::format("no slot '{}': this server has slots 0 to {}", id, slots_.size() - 1));
    std::string action;
    for (size_t at = 0; at <= query.size();) {
        const size_t end = std::min(query.find('&', at), query.size());
        const std::string_view kv = query.substr(at, end - at);
        if (kv.starts_with("action=")) action = std::string(kv.substr(7));
        at = end + 1;
    }
    if (action == "erase") {
        std::lock_guard lock(mu_);
        const size_t n = slots_[size_t(slot)].tokens.size();
        slots_[size_t(slot)].tokens.clear();
        return {200, {{"id_slot", slot}, {"n_erased", n}}, ""};
    }
    if (action != "save" && action != "restore")
        return fail(400, fmt::format("unknown slot action '{}' (save, restore or erase)", action));
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("filename") || !j["filename"].is_string())
        return fail(400, "the body must be a JSON object with a \"filename\"");
    const std::string name = j["filename"].get<std::string>();
    if (!slot_filename_ok(name))
        return fail(400, fmt::format("invalid slot file name '{}' (a plain file name in "
                                     "--slot-save-path)",
                                     name));
    const std::string path = (std::filesystem::path(dir_) / name).string();
    const auto t0 = std::chrono::steady_clock::now();
    auto ms = [&] {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
            .count();
    };
    try {
        if (action == "save") {
            const std::vector<TokenId> toks = tokens(slot);
            int64_t blocks = 0;
            worker.call([&](Engine& e) {
                blocks = prompt_cache_save(path, key_, e.kv_table(), e.backend(), {toks});
            });
            std::error_code ec;
            const auto bytes = std::filesystem::file_size(path, ec);
            return {200,
                    {{"id_slot", slot},
                     {"filename", name},
                     {"n_saved", blocks * key_.block_size},
                     {"n_written", ec ? 0 : bytes},
                     {"timings", {{"save_ms", ms()}}}},
                    ""};
        }
        PromptCacheLoad got;
        worker.call([&](Engine& e) {
            got = prompt_cache_load(path, key_, e.kv_table(), e.backend(), n_vocab);
        });
        if (!got.found) return fail(404, fmt::format("no slot file '{}'", name));
        if (!got.ignored.empty())
            return fail(400, fmt::format("slot file '{}' does not fit: {}", name, got.ignored));
        const int64_t n = std::min<int64_t>(int64_t(got.chain.size()),
                                            got.chain_blocks_present * key_.block_size);
        finish(slot, std::vector<TokenId>(got.chain.begin(), got.chain.begin() + n));
        std::error_code ec;
        const auto bytes = std::filesystem::file_size(path, ec);
        return {200,
                {{"id_slot", slot},
                 {"filename", name},
                 {"n_restored", n},
                 {"n_read", ec ? 0 : bytes},
                 {"timings", {{"restore_ms", ms()}}}},
                ""};
    } catch (const Error& e) {
        // A file that is not a slot file, or a corrupt one, is the caller's; a failed write ours.
        return fail(action == "restore" ? 400 : 500, error_text(e));
    }
}

}  // namespace kvrun
