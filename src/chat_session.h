// One multi-turn conversation on the engine (the logic behind `kvrun chat`, no terminal
// I/O): formats each user message with the chat template, appends only the new tokens to
// an engine session (the conversation's KV sequence stays alive between turns, so a turn
// prefills just its own tokens), streams the reply UTF-8-safely while holding back text that
// may start a stop string, and handles a conversation that outgrows the context:
//   stop   — say so and end the reply (a message that does not fit is refused);
//   shift  — drop the oldest half of the non-system turns and re-prefill the rest;
//   sinks  — StreamingLLM-style attention sinks by recomputation: keep the first n_sink
//            tokens plus the most recent window (half the context) and re-prefill them into
//            a fresh sequence, so RoPE positions stay contiguous and the chat can go on
//            indefinitely. (Recomputing costs one prefill of half the context per overflow;
//            it avoids re-rotating cached keys, which the paged cache does not support.)
// Both shift and sinks continue an interrupted reply after re-prefilling.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "chat_format.h"
#include "chat_template.h"
#include "engine.h"
#include "tokenizer.h"

namespace kvrun {

enum class ContextOverflow { Stop, Shift, Sinks };
ContextOverflow context_overflow_from_name(std::string_view name);  // throws Error

struct ChatConfig {
    // The chat format as chat_template_choose picks it (its note unused); the session adds
    // the vocabulary's special texts and end-of-turn stops (chat_format_make). With a Jinja
    // template each message re-renders the whole conversation and prefills what follows the
    // tokens the session holds (all of it, helped by the prefix cache, when the template
    // rewrote earlier turns).
    ChatTemplateChoice chat_template;
    std::string system;      // system prompt ("" for none)
    int32_t n_predict = -1;  // max reply tokens (< 0: until the end of turn)
    SamplingParams sampling;
    bool ignore_eos = false;  // keep going past end-of-turn tokens (tests, demos)
    ContextOverflow overflow = ContextOverflow::Shift;
    // Every reply follows this grammar (null: free text); a reply continued after a context
    // overflow keeps its place in it.
    std::shared_ptr<const Grammar> grammar;
    int32_t n_sink = 4;  // sinks: leading tokens always kept
    // More texts that end a reply (llama.cpp's -r/--reverse-prompt), like the template's own
    // end-of-turn texts: the reply is cut before them.
    std::vector<std::string> stop;
    // --reasoning-budget (-1: none) and --reasoning-budget-message (reasoning_budget_for).
    int32_t reasoning_budget = -1;
    std::string reasoning_budget_message;
};

// What the last turn did.
struct ChatTurnStats {
    int32_t n_appended = 0;   // tokens this message added to the conversation
    int32_t n_prefilled = 0;  // tokens run through the model before the reply (all requests)
    int32_t n_reused = 0;     // conversation tokens whose K/V were reused from earlier turns
    int32_t n_generated = 0;  // reply tokens
    int32_t n_overflows = 0;  // context shifts/cuts during this turn
    int32_t n_drafted = 0;    // speculative decoding (engine with a draft model): drafts
    int32_t n_accepted = 0;   // proposed and accepted during this turn
    int32_t n_spec_rounds = 0;
    StopReason stop = StopReason::None;
    GenerationTimings timings;  // of the first request of the turn
};

class ChatSession {
  public:
    using TextSink = std::function<void(std::string_view)>;

    ChatSession(Engine& engine, const Tokenizer& tok, ChatConfig config);
    ~ChatSession();

    // Sends a user message and generates the reply, streaming its text to `on_text` (and
    // notes such as "[context shifted: ...]" to `on_notice`). Returns the reply text.
    // `cancel` (Ctrl-C) ends the reply early; the partial reply stays in the conversation.
    // Throws Error when the message cannot be sent (e.g. it does not fit with --stop); the
    // conversation and last_turn() are then those of the previous turn.
    std::string send(const std::string& user, const TextSink& on_text, const TextSink& on_notice,
                     const std::atomic<bool>* cancel = nullptr);

    void reset();                              // forget the conversation (keeps the system)
    void set_system(const std::string& text);  // new system prompt, conversation reset
    // Takes back the last exchange (the user message and its reply): the conversation and
    // its sequence return to before it. False when there is none to take back (nothing sent
    // since the start, a reset, or a context overflow that rebuilt the conversation).
    bool undo();
    // Generates the last reply again with a new draw (the sampler's seed moves on; greedy
    // sampling gives the same reply). False when undo() could not take the exchange back.
    bool regenerate(const TextSink& on_text, const TextSink& on_notice,
                    const std::atomic<bool>* cancel = nullptr);

    const ChatTurnStats& last_turn() const { return last_; }  // the last turn that was sent
    int32_t n_tokens() const;                    // tokens in the conversation's sequence
    const std::vector<TokenId>& tokens() const;  // the conversation's sequence
    int32_t n_cached_tokens() const;             // of which the KV cache holds
    const std::vector<ChatMessage>& messages() const { return history_; }
    const ChatConfig& config() const { return cfg_; }
    const std::vector<TokenId>& stop_tokens() const { return format_.stops.tokens; }
    const std::vector<std::string>& stop_strings() const { return stop_strings_; }
    // The chat format's replies may start with <think> reasoning (ChatFormat::thinks), and
    // the last reply's prompt opened the block (the reply starts inside it): what a caller
    // needs to show the reasoning apart (reasoning.h).
    bool thinks() const { return format_.thinks; }
    bool reply_opened_reasoning() const { return reply_opened_reasoning_; }

  private:
    std::vector<TokenId> encode(const std::string& text, bool first) const;
    bool fits(size_t n_tokens) const;
    std::vector<TokenId> sinks_cut(const std::vector<TokenId>& tokens) const;
    std::vector<TokenId> shift_rebuild(const ChatMessage& user, const std::vector<TokenId>& reply,
                                       int32_t& n_dropped);
    void restart_session();
    // The conversation in the chat format, with the reply header (built-in or Jinja).
    std::string format(const std::vector<ChatMessage>& msgs) const;

    Engine& engine_;
    const Tokenizer& tok_;
    ChatConfig cfg_;
    ChatFormat format_;  // cfg_.chat_template with the vocabulary's texts and end-of-turn ids
    // The format's end-of-turn texts that are not one token, then cfg_.stop.
    std::vector<std::string> stop_strings_;
    std::vector<ChatMessage> history_;  // system (if any), then user/assistant turns
    int32_t session_ = -1;
    bool reply_open_ = false;  // the last reply's closing text is not in the sequence yet
    bool reply_opened_reasoning_ = false;
    // A built-in thinking format (Qwen 3 with ChatML, DeepSeek3): where the last reply's
    // tokens begin when it reasoned (-1 otherwise). history_ holds its answer alone, and the
    // next message first cuts the sequence back to here and writes the answer again, as the
    // models' own templates write earlier turns without their reasoning.
    int32_t reasoned_reply_at_ = -1;
    ChatTurnStats last_;
    // Where each exchange since the last reset or overflow began (undo).
    struct TurnStart {
        int32_t n_tokens = 0;
        size_t n_messages = 0;
        bool reply_open = false;
        int32_t reasoned_reply_at = -1;
    };
    std::vector<TurnStart> turns_;
    uint64_t n_redraws_ = 0;  // regenerate() calls: each moves the sampler's seed on
};

}  // namespace kvrun
