// Speculative decoding inside the engine's step (see engine.h). Every sequence whose part
// reaches its last token this step drafts on its own: K = its adaptive length, capped by the
// context and the tokens still wanted (0 before a multi-sample request forks). The draft model
// keeps one KV sequence per engine sequence, always a prefix of the sequence's tokens:
//   draft pass 0 — for each drafting sequence every token the draft has not seen (usually one or
//     two), logits at the last; for every other part the draft follows the target's prefill
//     chunk (within -b tokens), so it is in step when the sequence starts decoding;
//   draft pass i — the i-th draft of every sequence still drafting, one token each.
// The target then runs every sequence's [pending, d1 .. dK] in the step's one forward pass
// (engine.cpp); verify_drafts() applies the acceptance rule (speculative_accept.h) and
// truncates the rejected positions from both tables, so each table holds exactly the accepted
// tokens (the draft at most one less). A sequence whose draft cannot get blocks just does not
// speculate this step; its draft sequence is freed with it (finish, preemption, session close).
#include <algorithm>
#include <cmath>

#include "common.h"
#include "engine.h"
#include "engine_seq.h"

namespace kvrun {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// At admission: s's draft sequence — the session's (cut to its common prefix with s's tokens,
// all but the last token) or a new one adopting the draft's cached prefix.
void Engine::draft_init(Seq& s, Session* session) {
    const size_t limit = s.tokens.size() - 1;  // the last token is fed when drafting
    if (session && session->draft_kv >= 0) {
        s.draft_kv = session->draft_kv;
        session->draft_kv = -1;
        const std::vector<TokenId>& have = draft_table_->tokens(s.draft_kv);
        const size_t n = std::min(have.size(), limit);
        size_t common = 0;
        while (common < n && have[common] == s.tokens[common]) ++common;
        if (common < have.size()) draft_table_->rollback(s.draft_kv, static_cast<int32_t>(common));
        return;
    }
    std::span<const TokenId> prefix(s.tokens.data(), limit);
    s.draft_kv = opt_.prefix_cache && s.req->cache_prompt
                     ? draft_table_->create_sequence_with_prefix(prefix)
                     : draft_table_->create_sequence();
}

// Drafts for s's next round: 0 when it cannot speculate now.
int32_t Engine::draft_length(const Seq& s) const {
    if (draft_ && (s.draft_kv < 0 || !s.draft_sampler)) return 0;
    if (s.req->n_samples > 1 && !s.forked) return 0;  // samples fork at the prompt's logits
    if (s.forcing()) return 0;                        // the next tokens are known
    // The target writes positions n-1 .. n-1+k, all inside the context; drafting more than the
    // tokens still wanted (minus the target's own) is wasted.
    int32_t k = std::min(s.k, n_ctx_ - s.n_tokens());
    if (s.req->n_predict >= 0) k = std::min(k, s.req->n_predict - s.n_generated() - 1);
    return std::max(k, 0);
}

// The last tokens the sampler looks at (all of them for a window of -1).
std::vector<TokenId> Engine::recent_window(const Seq& s) const {
    const int32_t last_n = sampling_history_length(s.req->sampling);
    const int32_t n = s.n_tokens();
    const int32_t keep = last_n < 0 ? n : std::min(n, last_n);
    return std::vector<TokenId>(s.tokens.end() - keep, s.tokens.end());
}

// Appends toks to s's draft sequence; out of draft blocks, idle sessions' draft sequences are
// dropped first. False when it still does not fit (s then does not speculate this step).
bool Engine::draft_append(Seq& s, std::span<const TokenId> toks) {
    if (draft_table_->append(s.draft_kv, toks)) return true;
    for (auto& [id, ses] : sessions_) {
        if (ses.draft_kv < 0) continue;
        draft_table_->free_sequence(ses.draft_kv);
        ses.draft_kv = -1;
        if (draft_table_->append(s.draft_kv, toks)) return true;
    }
    return false;
}

void Engine::draft_forward(const ForwardBatch& fb) {
    kv_apply_pending(*draft_table_, *draft_);
    const size_t n_vocab = static_cast<size_t>(draft_->config().n_vocab);
    draft_logits_.resize(std::max<size_t>(1, fb.logit_rows.size()) * n_vocab);
    const auto t0 = Clock::now();
    draft_->forward(fb, draft_logits_.data());
    stats_.spec.draft_ms += ms_since(t0);
    stats_.spec.draft_passes++;
}

namespace {

// The draft model's probability of its token t: from its sampling distribution q_row when
// the sequence samples, else the softmax of its logits (greedy drafting).
float draft_probability(const float* logits, int n_vocab, const float* q_row, TokenId t) {
    return q_row ? q_row[t] : std::exp(token_logprobs(logits, n_vocab, t, 0).chosen.logprob);
}

}  // namespace

void Engine::draft_round(std::vector<Part>& parts) {
    const int n_vocab = static_cast<int>(draft_->config().n_vocab);
    const size_t V = static_cast<size_t>(n_vocab);
    std::vector<Part*> active;  // parts drafting, in the order of the pass's logit rows
    ForwardBatch fb;
    int32_t budget = opt_.n_batch;  // draft tokens that only follow the target's prefill
    std::vector<TokenId> toks;
    for (Part& p : parts) {
        Seq& s = *p.s;
        s.drafts.clear();
        if (s.draft_kv < 0) {
            p.k = 0;
            continue;
        }
        int32_t have = draft_table_->n_tokens(s.draft_kv);
        if (p.k > 0) {
            // Everything the draft has not seen, with logits at the sequence's last token.
            if (have > s.n_tokens() - 1)
                have = draft_table_->rollback(s.draft_kv, s.n_tokens() - 1);
            toks.assign(s.tokens.begin() + have, s.tokens.end());
            if (!draft_append(s, toks)) {
                p.k = 0;
                continue;
            }
            fb.add_sequence(*draft_table_, s.draft_kv, have, static_cast<int32_t>(toks.size()));
            fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size()) - 1);
            if (!s.sampler->greedy()) s.q.resize(static_cast<size_t>(p.k) * V);
            if (s.grammar) {  // the draft proposes only what the grammar allows
                s.draft_grammar = std::make_unique<GrammarConstraint>(*s.grammar);
                s.draft_sampler->set_constraint(s.draft_grammar.get());
            }
            active.push_back(&p);
            continue;
        }
        // No drafts this step: the draft follows the target's prefill (within the budget). A
        // decoding part without drafts is the sequence's last token (n_predict, context).
        if (p.n == 1 && p.start >= s.n_prompt) continue;
        const int32_t m = std::min(p.start + p.n - have, budget);
        if (m <= 0) continue;
        toks.assign(s.tokens.begin() + have, s.tokens.begin() + have + m);
        if (!draft_append(s, toks)) continue;
        budget -= m;
        fb.add_sequence(*draft_table_, s.draft_kv, have, m);
    }
    if (fb.tokens.empty()) return;
    draft_forward(fb);

    std::vector<TokenId> recent;
    while (!active.empty()) {
        // Draw each active part's next draft from the last pass's logits.
        for (size_t j = 0; j < active.size(); ++j) {
            Seq& s = *active[j]->s;
            recent = recent_window(s);
            recent.insert(recent.end(), s.drafts.begin(), s.drafts.end());
            float* q_row = s.sampler->greedy() ? nullptr : s.q.data() + s.drafts.size() * V;
            const float* row = draft_logits_.data() + j * V;
            try {
                const TokenId t =
                    speculative_draft_token(*s.draft_sampler, row, n_vocab, recent, q_row);
                if (opt_.draft_p_min > 0 &&
                    draft_probability(row, n_vocab, q_row, t) < opt_.draft_p_min) {
                    active[j]->k = static_cast<int32_t>(s.drafts.size());  // unsure: stop here
                    continue;
                }
                if (s.draft_grammar) s.draft_grammar->accept(t);
                s.drafts.push_back(t);
            } catch (const Error&) {  // no draft possible here: verify what there is
                active[j]->k = static_cast<int32_t>(s.drafts.size());
            }
        }
        // The next pass runs the newest draft of every part that wants more.
        fb = ForwardBatch{};
        std::vector<Part*> next;
        for (Part* p : active) {
            Seq& s = *p->s;
            if (static_cast<int32_t>(s.drafts.size()) >= p->k) continue;
            if (s.draft_grammar && (s.draft_grammar->finished() || tok_.is_eog(s.drafts.back())))
                continue;  // the text cannot go on: no more drafts
            if (!draft_append(s, std::span<const TokenId>(&s.drafts.back(), 1))) continue;
            fb.add_sequence(*draft_table_, s.draft_kv, draft_table_->n_tokens(s.draft_kv) - 1, 1);
            fb.logit_rows.push_back(static_cast<int32_t>(fb.tokens.size()) - 1);
            next.push_back(p);
        }
        if (next.empty()) break;
        draft_forward(fb);
        active = std::move(next);
    }
    for (Part& p : parts)
        if (p.k > 0) p.k = static_cast<int32_t>(p.s->drafts.size());
}

// Prompt lookup: each part's drafts continue the most recent earlier occurrence of its last
// tokens (cut where a grammar refuses them); sampled sequences get one-hot draft rows.
void Engine::lookup_round(std::vector<Part>& parts) {
    const size_t V = static_cast<size_t>(backend_.config().n_vocab);
    for (Part& p : parts) {
        Seq& s = *p.s;
        s.drafts.clear();
        if (p.k <= 0) continue;
        s.drafts = speculative_lookup_drafts(s.tokens, opt_.draft_ngram, p.k);
        if (s.grammar) {
            GrammarConstraint g(*s.grammar);
            size_t ok = 0;
            while (ok < s.drafts.size() && !tok_.is_eog(s.drafts[ok]) && g.try_accept(s.drafts[ok]))
                ++ok;
            s.drafts.resize(ok);
        }
        p.k = static_cast<int32_t>(s.drafts.size());
        if (p.k > 0 && !s.sampler->greedy()) {
            s.q.assign(static_cast<size_t>(p.k) * V, 0.0f);
            for (size_t i = 0; i < s.drafts.size(); ++i)
                s.q[i * V + static_cast<size_t>(s.drafts[i])] = 1.0f;
        }
    }
}

// After the target pass: judges s's k drafts against logits: [k + 1][n_vocab], rolls both
// tables back to the accepted tokens, adapts K, and leaves the tokens to output in s.drafts
// (the accepted drafts, then the target's token).
void Engine::verify_drafts(Seq& s, const float* logits, int32_t k) {
    const int n_vocab = static_cast<int>(backend_.config().n_vocab);
    std::vector<TokenId> context = recent_window(s);
    context.insert(context.end(), s.drafts.begin(), s.drafts.begin() + k);
    // With a grammar, row i is judged under the grammar's state after drafts [0, i) (drafts
    // are drawn under it, so they continue it; past an end token the state stays put).
    std::vector<std::unique_ptr<GrammarConstraint>> states;
    std::vector<const TokenConstraint*> rows;
    if (s.grammar) {
        states.push_back(std::make_unique<GrammarConstraint>(*s.grammar));
        for (int32_t i = 0; i < k; ++i) {
            states.push_back(std::make_unique<GrammarConstraint>(*states.back()));
            states.back()->try_accept(s.drafts[i]);  // a refused draft leaves the state put
        }
        for (const auto& st : states) rows.push_back(st.get());
    }
    const SpecAcceptResult res = speculative_verify(*s.sampler, logits, n_vocab, context, k,
                                                    s.sampler->greedy() ? nullptr : s.q.data(),
                                                    opt_.accept_rule, p_scratch_, rows);
    if (s.grammar) s.sampler->set_constraint(s.grammar.get());
    // Both tables keep the sequence plus the accepted drafts (the token that follows them has
    // not been run through either model yet).
    const int32_t keep = s.n_tokens() + res.n_accepted;
    table_.truncate(s.kv, keep);
    s.n_computed = keep;
    if (s.draft_kv >= 0 && draft_table_->n_tokens(s.draft_kv) > keep)
        draft_table_->truncate(s.draft_kv, keep);
    s.n_drafted += k;
    s.n_accepted += res.n_accepted;
    s.n_spec_rounds++;
    stats_.spec.rounds++;
    stats_.spec.drafted += k;
    stats_.spec.accepted += res.n_accepted;
    s.k = speculative_next_k(s.k, k, res.n_accepted, opt_.draft_min, opt_.draft_max);
    s.drafts.resize(static_cast<size_t>(res.n_accepted));
    s.drafts.push_back(res.next);
}

}  // namespace kvrun
