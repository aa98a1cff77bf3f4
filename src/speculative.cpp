// Speculative decoding (see speculative.h): the vocabulary check, and SpeculativeDecoder — one
// request at a time on an engine with a draft model (the rounds are in engine_speculative.cpp).
#include "speculative.h"

#include <algorithm>

#include "common.h"

namespace kvrun {

namespace {

EngineOptions decoder_engine_options(Backend& target, Backend& draft, const SpeculativeOptions& o) {
    EngineOptions e;
    e.max_parallel = 1;
    e.n_batch = o.n_batch;
    e.prefix_cache = o.prefix_cache;
    e.draft = &draft;
    e.draft_max = o.draft_max;
    e.draft_min = o.draft_min;
    e.accept_rule = o.rule;
    // The context also fits the draft's pool (the engine itself caps it by the target's).
    int64_t ctx = o.n_ctx > 0 ? o.n_ctx : target.config().n_ctx_train;
    if (ctx <= 0) ctx = 4096;
    ctx = std::min(ctx, draft.n_kv_blocks() * draft.kv_block_size());
    e.n_ctx = static_cast<int32_t>(std::min<int64_t>(ctx, INT32_MAX));
    return e;
}

}  // namespace

void check_vocab_compatible(const Tokenizer& target, const Tokenizer& draft) {
    if (target.n_vocab() != draft.n_vocab())
        throw Error(
            fmt::format("the draft model's vocabulary has {} tokens but the target's has {}",
                        draft.n_vocab(), target.n_vocab()),
            "use a draft model of the same family (same tokenizer) as the target");
    for (TokenId id = 0; id < target.n_vocab(); ++id) {
        if (target.token_text(id) != draft.token_text(id))
            throw Error(
                fmt::format("the draft model's vocabulary differs from the target's: token {} "
                            "is '{}' in the target but '{}' in the draft",
                            id, target.token_text(id), draft.token_text(id)),
                "use a draft model of the same family (same tokenizer) as the target");
    }
}

SpeculativeDecoder::SpeculativeDecoder(Backend& target, Backend& draft, const Tokenizer& tokenizer,
                                       SpeculativeOptions options)
    : engine_(target, tokenizer, decoder_engine_options(target, draft, options)) {
    if (target.config().n_vocab != tokenizer.n_vocab())
        fail("the target model outputs {} logits per token but its vocabulary has {} tokens",
             target.config().n_vocab, tokenizer.n_vocab());
    engine_.on_token([this](int32_t, int32_t, TokenId t, const TokenLogprobs*) {
        tokens_.push_back(t);
        if (on_token_) on_token_(t);
    });
    engine_.on_finish([this](const GenerationResult& r) {
        result_ = r;
        done_ = true;
    });
}

SpeculativeDecoder::~SpeculativeDecoder() {
    engine_.on_finish(nullptr);
    engine_.on_token(nullptr);
    engine_.cancel_all();
}

void SpeculativeDecoder::start(const GenerationRequest& request,
                               std::function<void(TokenId)> on_token) {
    if (active_) fail("speculative decoder: a request is still running (call finish() first)");
    if (request.n_samples != 1)
        throw Error(fmt::format("speculative decoding runs one sample per request (got {})",
                                request.n_samples),
                    "drop --n-samples or --draft-model");
    GenerationRequest req = request;
    req.session = -1;
    request_ = engine_.submit(std::move(req));  // throws Error for a bad request
    on_token_ = std::move(on_token);
    tokens_ = request.prompt;
    result_ = {};
    done_ = false;
    active_ = true;
}

bool SpeculativeDecoder::step() {
    if (!active_ || done_) return false;
    engine_.step();
    return !done_;
}

GenerationResult SpeculativeDecoder::finish() {
    if (!active_) fail("speculative decoder: finish() without a running request");
    if (!done_) engine_.cancel_all();  // reports Cancelled through on_finish
    active_ = false;
    on_token_ = nullptr;
    return result_;
}

GenerationResult SpeculativeDecoder::generate(const GenerationRequest& request,
                                              const std::function<void(TokenId)>& on_token,
                                              const std::atomic<bool>* cancel) {
    start(request, on_token);
    try {
        while (step())
            if (cancel && cancel->load()) break;
    } catch (const Error& e) {
        GenerationResult r = finish();
        r.stop = StopReason::Error;
        r.error = e.what();
        return r;
    }
    return finish();
}

SeqId SpeculativeDecoder::target_seq() const {
    for (const EngineSequenceInfo& i : engine_.running_sequences())
        if (i.request == request_) return i.kv;
    return -1;
}

SeqId SpeculativeDecoder::draft_seq() const {
    for (const EngineSequenceInfo& i : engine_.running_sequences())
        if (i.request == request_) return i.draft_kv;
    return -1;
}

int32_t SpeculativeDecoder::current_k() const {
    for (const EngineSequenceInfo& i : engine_.running_sequences())
        if (i.request == request_) return i.draft_k;
    return 0;
}

}  // namespace kvrun
