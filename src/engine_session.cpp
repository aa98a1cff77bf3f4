// Engine sessions (see engine.h): a conversation's sequence — its tokens and its K/V in the
// target's and the draft's table — kept between requests, so a chat turn computes only the
// tokens it appends. Idle sessions give their K/V up under memory pressure (engine.cpp).
#include <algorithm>

#include "common.h"
#include "engine.h"
#include "engine_seq.h"

namespace kvrun {

// Hands a finished session request's sequence (tokens and K/V in both tables) to its session.
// K/V past the tokens (drafts computed after a stop) are dropped.
void Engine::keep_in_session(Seq& s, Session& ses) {
    const int32_t n = s.n_tokens();
    if (s.kv >= 0) {
        if (ses.kv >= 0) table_.free_sequence(ses.kv);
        if (ses.draft_kv >= 0) draft_table_->free_sequence(ses.draft_kv);
        if (table_.n_tokens(s.kv) > n) table_.truncate(s.kv, n);
        ses.kv = s.kv;
        ses.n_cached = std::min(s.n_computed, n);
        if (s.draft_kv >= 0 && draft_table_->n_tokens(s.draft_kv) > n)
            draft_table_->truncate(s.draft_kv, n);
        ses.draft_kv = s.draft_kv;
        s.kv = s.draft_kv = -1;
    }
    ses.tokens = s.tokens;
    ses.busy = false;
}

Engine::Session& Engine::session_ref(int32_t id) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) fail("unknown engine session {}", id);
    return it->second;
}

const Engine::Session& Engine::session_ref(int32_t id) const {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) fail("unknown engine session {}", id);
    return it->second;
}

int32_t Engine::open_session() {
    const int32_t id = next_session_++;
    sessions_.emplace(id, Session{});
    return id;
}

void Engine::close_session(int32_t id) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    if (it->second.busy) fail("session {} cannot close while a request runs in it", id);
    if (it->second.kv >= 0) table_.free_sequence(it->second.kv);
    if (it->second.draft_kv >= 0) draft_table_->free_sequence(it->second.draft_kv);
    sessions_.erase(it);
}

const std::vector<TokenId>& Engine::session_tokens(int32_t id) const {
    return session_ref(id).tokens;
}

int32_t Engine::session_cached_tokens(int32_t id) const {
    const Session& s = session_ref(id);
    return s.kv >= 0 ? s.n_cached : 0;
}

void Engine::truncate_session(int32_t id, int32_t n_tokens) {
    Session& s = session_ref(id);
    if (s.busy) fail("session {} cannot be truncated while a request runs in it", id);
    if (n_tokens < 0 || n_tokens > static_cast<int32_t>(s.tokens.size()))
        fail("cannot truncate session {} of {} tokens to {}", id, s.tokens.size(), n_tokens);
    s.tokens.resize(static_cast<size_t>(n_tokens));
    if (s.kv >= 0 && s.n_cached > n_tokens) s.n_cached = table_.rollback(s.kv, n_tokens);
    if (s.draft_kv >= 0 && draft_table_->n_tokens(s.draft_kv) > n_tokens)
        draft_table_->rollback(s.draft_kv, n_tokens);
}

}  // namespace kvrun
