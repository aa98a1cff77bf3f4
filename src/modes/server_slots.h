// llama-server's slot persistence (--slot-save-path DIR). Each of the --parallel slots
// remembers the tokens (prompt and reply) of the last request that ran in it: the one a
// request names with "id_slot", else the least recently used. POST /slots/{id}?action=...:
//   save    {"filename"}: writes the K/V of those tokens that the prefix cache still holds
//           (its full blocks) to DIR/filename, as a prompt cache file (prompt_cache.h);
//   restore {"filename"}: loads such a file back into the prefix cache, so that a later
//           prompt starting with its tokens skips their prefill, and makes them the slot's;
//   erase: forgets the slot's tokens (their cached blocks stay, evictable, for any prompt).
// kvrun's prefix cache is shared by all slots, so a restored conversation serves a request
// in any slot. Thread-safe: the server's connections call it at once.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine_worker.h"
#include "prompt_cache.h"
#include "tokenizer.h"

namespace kvrun {

// An answer: HTTP status and body (an error's message when status is not 200).
struct SlotAnswer {
    int status = 200;
    nlohmann::json body;
    std::string error;
};

class ServerSlots {
  public:
    // `save_dir` empty: the actions answer 501 (slots are still taken and remembered); else it
    // must be a directory (Error).
    ServerSlots(int32_t n_slots, std::string save_dir, PromptCacheKey key);
    // The slot a request runs in: `asked` when >= 0 (Error when it is not a slot), else the
    // least recently used one.
    int32_t take(int32_t asked);
    // The request in `slot` ended: its prompt's tokens, then its reply's.
    void finish(int32_t slot, std::vector<TokenId> tokens, std::span<const TokenId> reply = {});
    std::vector<TokenId> tokens(int32_t slot) const;
    // METHOD /slots/{id} (POST, else 405): `id` the path's last part, `query` the URL's
    // query, `body` the JSON.
    SlotAnswer action(std::string_view method, std::string_view id, std::string_view query,
                      const std::string& body, EngineWorker& worker, int64_t n_vocab);

  private:
    struct Slot {
        std::vector<TokenId> tokens;
        uint64_t used = 0;  // when it was last taken (a counter)
    };
    mutable std::mutex mu_;
    std::vector<Slot> slots_;
    uint64_t clock_ = 0;
    std::string dir_;
    PromptCacheKey key_;
};

// llama-server's rule for a slot file name: not empty, at most 255 bytes, valid UTF-8 with no
// control characters, no path separators or ':', not "." or ".." and not starting with '.'.
bool slot_filename_ok(std::string_view name);

}  // namespace kvrun
