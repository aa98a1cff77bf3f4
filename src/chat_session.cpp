// ChatSession: template formatting per turn, incremental prefill through an engine session,
// stop-string-safe streaming, and the context overflow policies (see chat_session.h).
#include "chat_session.h"

#include <algorithm>

#include "common.h"
#include "reasoning.h"
#include "stop_text.h"

namespace kvrun {

ContextOverflow context_overflow_from_name(std::string_view name) {
    if (name == "stop") return ContextOverflow::Stop;
    if (name == "shift") return ContextOverflow::Shift;
    if (name == "sinks") return ContextOverflow::Sinks;
    throw Error(fmt::format("unknown context overflow policy '{}'", name),
                "use --context-overflow stop, shift or sinks");
}

std::string ChatSession::format(const std::vector<ChatMessage>& msgs) const {
    return format_.render(msgs, true);
}

ChatSession::ChatSession(Engine& engine, const Tokenizer& tok, ChatConfig config)
    : engine_(engine), tok_(tok), cfg_(std::move(config)) {
    if (cfg_.n_sink < 0) fail("the number of sink tokens must be >= 0 (got {})", cfg_.n_sink);
    format_ = chat_format_make(cfg_.chat_template, tok_);
    stop_strings_ = format_.stops.strings;
    for (const std::string& s : cfg_.stop)
        if (!s.empty()) stop_strings_.push_back(s);
    session_ = engine_.open_session();
    reset();
}

ChatSession::~ChatSession() {
    try {
        engine_.close_session(session_);
    } catch (const Error&) {
    }
}

void ChatSession::restart_session() {
    engine_.close_session(session_);
    session_ = engine_.open_session();
}

void ChatSession::reset() {
    restart_session();
    history_.clear();
    if (!cfg_.system.empty()) history_.push_back({"system", cfg_.system});
    reply_open_ = false;
    last_ = {};
    turns_.clear();
}

bool ChatSession::undo() {
    if (turns_.empty()) return false;
    const TurnStart t = turns_.back();
    turns_.pop_back();
    engine_.truncate_session(session_, t.n_tokens);
    history_.resize(t.n_messages);
    reply_open_ = t.reply_open;
    reasoned_reply_at_ = t.reasoned_reply_at;
    last_ = {};
    return true;
}

bool ChatSession::regenerate(const TextSink& on_text, const TextSink& on_notice,
                             const std::atomic<bool>* cancel) {
    if (turns_.empty() || history_.size() <= turns_.back().n_messages) return false;
    const std::string user = history_[turns_.back().n_messages].content;
    undo();
    ++n_redraws_;
    send(user, on_text, on_notice, cancel);
    return true;
}

void ChatSession::set_system(const std::string& text) {
    cfg_.system = text;
    reset();
}

const std::vector<TokenId>& ChatSession::tokens() const {
    return engine_.session_tokens(session_);
}

int32_t ChatSession::n_tokens() const {
    return static_cast<int32_t>(engine_.session_tokens(session_).size());
}

int32_t ChatSession::n_cached_tokens() const {
    return engine_.session_cached_tokens(session_);
}

std::vector<TokenId> ChatSession::encode(const std::string& text, bool first) const {
    return tok_.encode(text, first && tok_.add_bos(), /*parse_special=*/true);
}

// Whether a sequence of n tokens leaves room to generate (an eighth of the context).
bool ChatSession::fits(size_t n) const {
    const size_t room = std::max<size_t>(1, static_cast<size_t>(engine_.n_ctx()) / 8);
    return n + room < static_cast<size_t>(engine_.n_ctx());
}

// Attention sinks: the first n_sink tokens plus the most recent ones, half a context in all.
std::vector<TokenId> ChatSession::sinks_cut(const std::vector<TokenId>& tokens) const {
    const size_t half = static_cast<size_t>(engine_.n_ctx()) / 2;
    const size_t sink = std::min(static_cast<size_t>(cfg_.n_sink), half / 2);
    const size_t window = std::max<size_t>(1, half - sink);
    if (tokens.size() <= sink + window) return tokens;
    std::vector<TokenId> out(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(sink));
    out.insert(out.end(), tokens.end() - static_cast<std::ptrdiff_t>(window), tokens.end());
    return out;
}

// Shift: drops the oldest half of the non-system turns (whole user/assistant pairs) until
// the conversation (ending with `user`, the last message of history_, plus the reply so far)
// fits; falls back to a sinks cut when even the last message alone is too long.
std::vector<TokenId> ChatSession::shift_rebuild(const ChatMessage& user,
                                                const std::vector<TokenId>& reply,
                                                int32_t& n_dropped) {
    const bool has_system = !history_.empty() && history_.front().role == "system";
    std::vector<ChatMessage> turns(history_.begin() + (has_system ? 1 : 0), history_.end() - 1);
    n_dropped = 0;
    std::vector<TokenId> tokens;
    for (;;) {
        size_t drop = (turns.size() + 1) / 2;
        drop = std::min(turns.size(), drop + drop % 2);
        turns.erase(turns.begin(), turns.begin() + static_cast<std::ptrdiff_t>(drop));
        n_dropped += static_cast<int32_t>(drop);
        std::vector<ChatMessage> msgs;
        if (has_system) msgs.push_back(history_.front());
        msgs.insert(msgs.end(), turns.begin(), turns.end());
        msgs.push_back(user);
        tokens = encode(format(msgs), true);
        tokens.insert(tokens.end(), reply.begin(), reply.end());
        if (fits(tokens.size()) || turns.empty()) {
            history_ = std::move(msgs);
            break;
        }
    }
    if (!fits(tokens.size())) tokens = sinks_cut(tokens);
    return tokens;
}

std::string ChatSession::send(const std::string& user, const TextSink& on_text,
                              const TextSink& on_notice, const std::atomic<bool>* cancel) {
    ChatMessage msg{"user", user};
    ChatTurnStats turn;  // becomes last_ once the message was sent
    TurnStart start{n_tokens(), history_.size(), reply_open_, reasoned_reply_at_};
    const bool first = engine_.session_tokens(session_).empty();
    std::vector<TokenId> add;
    int32_t cut_to = -1;  // >= 0: the sequence is cut back to here before `add` goes in
    bool opens = false;   // the text fed ends by opening a reasoning block (each ends so)
    if (first) {
        std::vector<ChatMessage> msgs = history_;
        msgs.push_back(msg);
        const std::string text = format(msgs);
        opens = prompt_opens_reasoning(text);
        add = encode(text, true);
    } else if (format_.jinja) {
        // The session holds the text of the last prompt plus the reply. When the whole
        // conversation's rendering continues that text, prefill the rest (as the built-in
        // formats' delta); otherwise the template rewrote earlier turns: start over.
        std::string fed;
        if (!history_.empty() && history_.back().role == "assistant") {
            const std::vector<ChatMessage> before(history_.begin(), history_.end() - 1);
            fed = format(before) + history_.back().content;
        }
        std::vector<ChatMessage> msgs = history_;
        msgs.push_back(msg);
        const std::string full = format(msgs);
        opens = prompt_opens_reasoning(full);
        if (!fed.empty() && full.size() > fed.size() && full.compare(0, fed.size(), fed) == 0) {
            add = encode(full.substr(fed.size()), false);
        } else {
            restart_session();  // (the prefix cache still serves the unchanged start)
            add = encode(full, true);
        }
    } else {
        std::string text;
        if (reasoned_reply_at_ >= 0 && reply_open_ && !history_.empty()) {
            // The last reply again without its reasoning (see reasoned_reply_at_): the
            // sequence is cut back to its start below, once the message is sure to go.
            cut_to = reasoned_reply_at_;
            text = history_.back().content;
        }
        if (reply_open_) text += chat_template_assistant_suffix(format_.kind, format_.special);
        text += chat_template_apply_delta(format_.kind, history_, msg, format_.special);
        opens = prompt_opens_reasoning(text);
        add = encode(text, false);
    }
    turn.n_appended = static_cast<int32_t>(add.size());
    if (!fits((cut_to >= 0 ? cut_to : n_tokens()) + add.size())) {
        if (cfg_.overflow == ContextOverflow::Stop)
            throw Error(
                fmt::format("the message does not fit in the context ({} + {} tokens of {})",
                            n_tokens(), add.size(), engine_.n_ctx()),
                "/reset starts a new conversation (or use --context-overflow shift)");
        history_.push_back(msg);
        std::vector<TokenId> whole;
        if (cfg_.overflow == ContextOverflow::Shift) {
            int32_t dropped = 0;
            whole = shift_rebuild(msg, {}, dropped);
            on_notice(fmt::format("[context full: dropped the {} oldest messages]", dropped));
        } else {
            whole = engine_.session_tokens(session_);
            if (cut_to >= 0) whole.resize(size_t(cut_to));
            whole.insert(whole.end(), add.begin(), add.end());
            whole = sinks_cut(whole);
            on_notice(fmt::format("[context full: kept {} sink tokens + the last {} tokens]",
                                  std::min<size_t>(cfg_.n_sink, whole.size()), whole.size()));
        }
        restart_session();
        add = std::move(whole);
        turn.n_overflows++;
    } else {
        history_.push_back(msg);
        if (cut_to >= 0) {
            engine_.truncate_session(session_, cut_to);
            start.n_tokens = cut_to;  // undo returns here (and writes the answer again)
        }
    }
    const int32_t was_reasoned_at = turn.n_overflows > 0 ? -1 : reasoned_reply_at_;
    reasoned_reply_at_ = -1;
    reply_opened_reasoning_ = format_.thinks && opens;
    const bool was_open = reply_open_;
    reply_open_ = false;

    // Streaming: the reply's leading whitespace is not shown; text that could start a stop
    // string waits until it can't.
    StreamDecoder decoder(tok_);
    std::string reply;
    std::vector<TokenId> reply_tokens;
    size_t shown = 0;
    auto emit = [&](size_t end) {
        size_t lead = reply.find_first_not_of(" \t\r\n");
        if (lead == std::string::npos) lead = reply.size();
        const size_t from = std::max(shown, lead);
        if (end > from) on_text(std::string_view(reply).substr(from, end - from));
        shown = std::max(shown, end);
    };
    auto stop_at = [&]() {
        size_t p = std::string::npos;
        for (const std::string& s : stop_strings_) p = std::min(p, reply.find(s));
        return p;
    };
    GenerationResult result;
    engine_.on_token([&](int32_t, int32_t, TokenId t, const TokenLogprobs*) {
        reply_tokens.push_back(t);
        reply += decoder.push(t);
        emit(std::min(reply.size() - stop_string_holdback(reply, stop_strings_), stop_at()));
    });
    engine_.on_finish([&](const GenerationResult& r) { result = r; });
    int32_t remaining = cfg_.n_predict;
    for (bool first_request = true;; first_request = false) {
        GenerationRequest req;
        req.session = session_;
        req.prompt = std::move(add);
        req.n_predict = remaining;
        req.sampling = cfg_.sampling;
        req.sampling.seed += 0x9E3779B97F4A7C15ull * n_redraws_;  // regenerate(): a new draw
        req.ignore_eos = cfg_.ignore_eos;
        if (!cfg_.ignore_eos) req.stop_tokens = format_.stops.tokens;
        req.stop_strings = stop_strings_;
        req.grammar = cfg_.grammar;
        if (req.grammar) req.grammar_prefix = reply_tokens;  // a continued reply
        if (cfg_.reasoning_budget >= 0) {
            req.reasoning_budget =
                reasoning_budget_for(cfg_.reasoning_budget, cfg_.reasoning_budget_message,
                                     reply_opened_reasoning_, tok_);
            // A reply continued after an overflow: the budget goes on where it stopped.
            if (!first_request) req.reasoning_budget.state = result.reasoning;
        }
        try {
            engine_.submit(std::move(req));
        } catch (const Error&) {
            engine_.on_token(nullptr);
            engine_.on_finish(nullptr);
            if (first_request) {  // the message was not sent
                history_.pop_back();
                reply_open_ = was_open;
                reasoned_reply_at_ = was_reasoned_at;  // (a cut sequence is cut again: no-op)
            }
            throw;
        }
        engine_.run(cancel);
        if (first_request) {
            turn.timings = result.timings;
            turn.n_reused = result.timings.n_prompt - result.timings.n_prompt_computed;
        }
        turn.n_prefilled += result.timings.n_prompt_computed;
        turn.n_drafted += result.n_drafted;
        turn.n_accepted += result.n_accepted;
        turn.n_spec_rounds += result.n_spec_rounds;
        if (result.stop != StopReason::Context) break;
        if (remaining >= 0) {
            remaining -= static_cast<int32_t>(result.tokens.size());
            if (remaining <= 0) {
                result.stop = StopReason::Length;
                break;
            }
        }
        if (cfg_.overflow == ContextOverflow::Stop) {
            on_notice("[context full: the reply stops here; /reset starts a new conversation]");
            break;
        }
        // Outgrown mid-reply: re-prefill a shorter conversation and continue the reply.
        if (cfg_.overflow == ContextOverflow::Shift) {
            int32_t dropped = 0;
            add = shift_rebuild(msg, reply_tokens, dropped);
            on_notice(fmt::format("[context full: dropped the {} oldest messages]", dropped));
        } else {
            add = sinks_cut(engine_.session_tokens(session_));
            on_notice(fmt::format("[context full: kept {} sink tokens + the last {} tokens]",
                                  cfg_.n_sink,
                                  add.size() - std::min<size_t>(cfg_.n_sink, add.size())));
        }
        restart_session();
        turn.n_overflows++;
    }
    engine_.on_token(nullptr);
    engine_.on_finish(nullptr);

    if (result.stop == StopReason::StopString && stop_at() != std::string::npos) {
        // Cut the reply before the stop string, in the text and in the sequence.
        const size_t p = stop_at();
        reply.resize(p);
        size_t len = 0, kept = 0;
        for (; kept < reply_tokens.size(); ++kept) {
            len += tok_.token_to_piece(reply_tokens[kept]).size();
            if (len > p) break;
        }
        const size_t drop = std::min(reply_tokens.size() - kept, result.tokens.size());
        engine_.truncate_session(session_, n_tokens() - static_cast<int32_t>(drop));
        reply_tokens.resize(kept);
    } else {
        reply += decoder.flush();
    }
    emit(reply.size());
    if (result.stop == StopReason::Error) on_notice("[error: " + result.error + "]");
    turn.n_generated = static_cast<int32_t>(reply_tokens.size());
    turn.stop = result.stop;
    const size_t lead = reply.find_first_not_of(" \t\r\n");
    // A harmony reply (gpt-oss) goes into the conversation as its answer alone: its template
    // writes earlier turns without their reasoning and refuses channel tags in a content. So
    // does a reply that reasoned in a built-in thinking format (reasoned_reply_at_).
    std::string kept = lead == std::string::npos ? "" : reply.substr(lead);
    if (harmony_reply(reply)) {
        kept = reasoning_split(reply, false).content;
    } else if (format_.thinks && !format_.jinja && result.stop != StopReason::Error) {
        const ReasoningSplit r = reasoning_split(reply, reply_opened_reasoning_);
        if (!r.reasoning.empty() && !r.content.empty()) {
            kept = r.content;
            reasoned_reply_at_ = n_tokens() - static_cast<int32_t>(reply_tokens.size());
        }
    }
    history_.push_back({"assistant", std::move(kept)});
    reply_open_ = true;
    last_ = turn;
    if (turn.n_overflows > 0)
        turns_.clear();  // the conversation was rebuilt: earlier starts no longer hold
    else
        turns_.push_back(start);
    return history_.back().content;
}

}  // namespace kvrun
