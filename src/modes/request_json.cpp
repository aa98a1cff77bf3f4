// Parsing JSON generation requests and writing JSON results (see request_json.h).
#include "modes/request_json.h"

#include <cmath>
#include <cstdint>
#include <optional>

#include "common.h"
#include "modes/grammar_options.h"
#include "modes/model_options.h"
#include "modes/server_tools.h"
#include "reasoning.h"
#include "text_input.h"

namespace kvrun {

namespace {

// "logit_bias": {"15043": -1.5, ...} (OpenAI) or [[15043, -1.5], [15044, false], ...]
// (llama.cpp's server; false bans the token). These replace the command line's biases.
std::vector<std::pair<TokenId, float>> logit_bias_from_json(const nlohmann::json& j) {
    const char* usage =
        "'logit_bias' must be an object {\"TOKEN_ID\": BIAS, ...} or an array [[TOKEN_ID, "
        "BIAS or false], ...]";
    auto bias_of = [&](const nlohmann::json& v) {
        if (v.is_boolean() && !v.get<bool>()) return -std::numeric_limits<float>::infinity();
        if (!v.is_number()) fail("{}", usage);
        return v.get<float>();
    };
    std::vector<std::pair<TokenId, float>> out;
    if (j.is_object()) {
        for (const auto& [key, v] : j.items()) {
            size_t used = 0;
            long id = -1;
            try {
                id = std::stol(key, &used);
            } catch (const std::exception&) {
            }
            if (used != key.size() || id < 0 || id > INT32_MAX)
                fail("'logit_bias': '{}' is not a token id", key);
            out.emplace_back(static_cast<TokenId>(id), bias_of(v));
        }
    } else if (j.is_array()) {
        for (const auto& e : j) {
            if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer()) fail("{}", usage);
            const auto id = e[0].get<int64_t>();
            if (id < 0 || id > INT32_MAX) fail("'logit_bias': {} is not a token id", id);
            out.emplace_back(static_cast<TokenId>(id), bias_of(e[1]));
        }
    } else {
        fail("{}", usage);
    }
    return out;
}

}  // namespace

// "lora": [{"id": 0, "scale": 0.5}, ...] -> one scale per loaded adapter (0 when left out).
std::vector<float> lora_scales_from_json(const nlohmann::json& j, int32_t n_lora) {
    if (n_lora == 0)
        throw Error("'lora': no LoRA adapter is loaded",
                    "load the adapters with --lora or --lora-scaled; \"id\" is their position");
    const char* shape = "'lora' must be an array of {\"id\": ADAPTER, \"scale\": SCALE}";
    if (!j.is_array()) fail("{}", shape);
    std::vector<float> out(size_t(n_lora), 0.0f);
    std::vector<bool> seen(size_t(n_lora), false);
    for (const auto& e : j) {
        if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() ||
            !e.contains("scale") || !e["scale"].is_number())
            fail("{}", shape);
        const int64_t id = e["id"].get<int64_t>();
        if (id < 0 || id >= n_lora)
            fail("'lora': adapter id {} is not loaded (ids 0..{})", id, n_lora - 1);
        if (seen[size_t(id)]) fail("'lora': adapter id {} is given twice", id);
        seen[size_t(id)] = true;
        const double scale = e["scale"].get<double>();
        if (!std::isfinite(scale) || std::fabs(scale) > 1e6)
            fail("'lora': scale {} of adapter {} is out of range", scale, id);
        out[size_t(id)] = float(scale);
    }
    return out;
}

GenerationRequest request_from_text(const std::string& prompt_text, const RequestDefaults& d,
                                    const Tokenizer& tok) {
    GenerationRequest req;
    req.n_predict = d.n_predict;
    req.sampling = d.sampling;
    req.n_samples = d.n_samples;
    req.ignore_eos = d.ignore_eos;
    req.stop_strings = d.stop;
    req.grammar = d.grammar;
    req.n_probs = d.n_probs;
    req.prompt = tok.encode(prompt_text, d.add_bos && tok.add_bos(), d.parse_special);
    return req;
}

ParsedRequest request_from_json(const std::string& line, const RequestDefaults& d,
                                const Tokenizer& tok) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
        fail("malformed JSON: {}", e.what());
    }
    if (!j.is_object()) fail("a request must be a JSON object");
    const bool chat = !j.contains("prompt") && j.contains("messages");
    if (chat) {  // the conversation in the chat format becomes the prompt
        if (!d.chat) fail("'messages' needs a chat format (give 'prompt' here)");
        j["prompt"] = d.chat->render(
            chat_messages_from_json(nlohmann::ordered_json::parse(j["messages"].dump())), true);
    }
    if (!j.contains("prompt") || !(j["prompt"].is_string() || j["prompt"].is_array()))
        fail("missing string field 'prompt' (or 'messages')");
    ParsedRequest out;
    GenerationRequest& req = out.request;
    // A prompt given as token ids ([15043, 3186, ...], llama.cpp's server) is used as is: no
    // BOS is added.
    std::optional<std::vector<TokenId>> prompt_ids;
    try {
        if (j["prompt"].is_array()) {
            prompt_ids.emplace();
            for (const auto& v : j["prompt"]) {
                if (!v.is_number_integer())
                    fail("'prompt' must be a string or an array of token ids");
                const int64_t id = v.get<int64_t>();
                if (id < 0 || id >= tok.n_vocab())
                    fail("'prompt': token id {} is outside the vocabulary (0..{})", id,
                         tok.n_vocab() - 1);
                prompt_ids->push_back(static_cast<TokenId>(id));
            }
            if (prompt_ids->empty()) fail("'prompt' is empty");
            out.prompt_text = tok.decode(*prompt_ids, false, true);
        } else {
            out.prompt_text = j["prompt"].get<std::string>();
            utf8_require_valid(out.prompt_text, "'prompt'");
            if (out.prompt_text.empty()) fail("'prompt' is empty");
        }
        if (j.contains("id")) out.id = j["id"];
        if (j.contains("n_keep") && !j["n_keep"].is_null()) {
            if (!j["n_keep"].is_number_integer() || j["n_keep"].get<int64_t>() < -1 ||
                j["n_keep"].get<int64_t>() > INT32_MAX)
                fail("'n_keep' must be -1 (the whole prompt) or a count >= 0 (got {})",
                     j["n_keep"].dump());
            out.n_keep = j["n_keep"].get<int32_t>();
        }
        req.n_predict = j.value("n_predict", d.n_predict);
        req.sampling = d.sampling;
        req.sampling.temperature = j.value("temperature", d.sampling.temperature);
        req.sampling.top_k = j.value("top_k", d.sampling.top_k);
        req.sampling.top_p = j.value("top_p", d.sampling.top_p);
        req.sampling.min_p = j.value("min_p", d.sampling.min_p);
        req.sampling.repeat_penalty = j.value("repeat_penalty", d.sampling.repeat_penalty);
        req.sampling.frequency_penalty = j.value("frequency_penalty", d.sampling.frequency_penalty);
        req.sampling.presence_penalty = j.value("presence_penalty", d.sampling.presence_penalty);
        req.sampling.repeat_last_n = j.value("repeat_last_n", d.sampling.repeat_last_n);
        req.sampling.seed = j.value("seed", d.sampling.seed);
        if (j.contains("seed") && j["seed"].is_number_integer() &&
            !j["seed"].is_number_unsigned()) {
            if (j["seed"].get<int64_t>() != -1)
                fail("'seed' must be a count >= 0 or -1 for a random one (got {})",
                     j["seed"].get<int64_t>());
            req.sampling.seed = random_seed();
        }
        req.sampling.dry_multiplier = j.value("dry_multiplier", d.sampling.dry_multiplier);
        req.sampling.dry_base = j.value("dry_base", d.sampling.dry_base);
        req.sampling.dry_allowed_length =
            j.value("dry_allowed_length", d.sampling.dry_allowed_length);
        req.sampling.dry_penalty_last_n =
            j.value("dry_penalty_last_n", d.sampling.dry_penalty_last_n);
        req.sampling.dry_sequence_breakers =
            j.value("dry_sequence_breakers", d.sampling.dry_sequence_breakers);
        req.sampling.top_n_sigma = j.value("top_n_sigma", d.sampling.top_n_sigma);
        req.sampling.typical_p = j.value("typical_p", d.sampling.typical_p);
        req.sampling.xtc_probability = j.value("xtc_probability", d.sampling.xtc_probability);
        req.sampling.xtc_threshold = j.value("xtc_threshold", d.sampling.xtc_threshold);
        req.sampling.dynatemp_range = j.value("dynatemp_range", d.sampling.dynatemp_range);
        req.sampling.mirostat = j.value("mirostat", d.sampling.mirostat);
        req.sampling.mirostat_tau = j.value("mirostat_tau", d.sampling.mirostat_tau);
        req.sampling.mirostat_eta = j.value("mirostat_eta", d.sampling.mirostat_eta);
        req.sampling.dynatemp_exponent = j.value("dynatemp_exponent", d.sampling.dynatemp_exponent);
        req.n_samples = j.value("n_samples", d.n_samples);
        req.ignore_eos = j.value("ignore_eos", d.ignore_eos);
        req.stop_strings = j.value("stop", d.stop);
        req.n_probs = j.value("n_probs", d.n_probs);
        req.cache_prompt = j.value("cache_prompt", true);
        // Code completion limits (llama-server's; llama.vim and llama.vscode send them).
        if (j.contains("t_max_predict_ms") && !j["t_max_predict_ms"].is_null()) {
            if (!j["t_max_predict_ms"].is_number() || j["t_max_predict_ms"].get<double>() < 0)
                fail("'t_max_predict_ms' must be a number of milliseconds >= 0 (got {})",
                     j["t_max_predict_ms"].dump());
            req.max_predict_ms = j["t_max_predict_ms"].get<double>();
        }
        if (j.contains("n_indent") && !j["n_indent"].is_null()) {
            if (!j["n_indent"].is_number_integer() || j["n_indent"].get<int64_t>() < 0 ||
                j["n_indent"].get<int64_t>() > INT32_MAX)
                fail("'n_indent' must be a count of spaces >= 0 (got {})", j["n_indent"].dump());
            req.n_indent = j["n_indent"].get<int32_t>();
        }
        if (j.contains("logit_bias") && !j["logit_bias"].is_null())
            req.sampling.logit_bias = logit_bias_from_json(j["logit_bias"]);
        if (j.contains("lora") && !j["lora"].is_null())
            req.lora = lora_scales_from_json(j["lora"], d.n_lora);
        if (j.contains("samplers") && !j["samplers"].is_null()) {
            // llama.cpp's server: a list of names, or one ';'-separated string.
            const auto& v = j["samplers"];
            std::string names;
            if (v.is_string())
                names = v.get<std::string>();
            else if (!v.is_array())
                fail("'samplers' must be a list of names or a ';'-separated string");
            else
                for (const auto& n : v) names += n.get<std::string>() + ";";
            req.sampling.order = sampler_order_parse(names);
        }
    } catch (const nlohmann::json::exception& e) {
        fail("bad field type: {}", e.what());
    }
    if (req.n_predict < -1)
        fail("'n_predict' must be -1 (no limit) or a count >= 0 (got {})", req.n_predict);
    if (req.n_probs < 0 || req.n_probs > kMaxLogprobs)
        fail("'n_probs' must be between 0 and {} (got {})", kMaxLogprobs, req.n_probs);
    if (req.n_samples < 1 || req.n_samples > 256)
        fail("'n_samples' must be between 1 and 256 (got {})", req.n_samples);
    sampling_validate(req.sampling);  // throws Error naming the bad value and its range
    merged_logit_bias(req.sampling, tok.n_vocab());  // token ids inside the vocabulary
    req.grammar = grammar_from_request(j, line, d.grammar);
    req.grammar_triggers = grammar_triggers_from_request(j, req.grammar != nullptr, tok);
    req.prompt = prompt_ids ? std::move(*prompt_ids)
                            : tok.encode(out.prompt_text, d.add_bos && tok.add_bos(),
                                         d.parse_special || chat);
    if (chat) {
        if (!req.ignore_eos) req.stop_tokens = d.chat->stops.tokens;
        for (const std::string& s : d.chat->stops.strings) req.stop_strings.push_back(s);
    }
    if (chat || d.chat_prompt) {
        int32_t budget = d.reasoning_budget;
        std::string message = d.reasoning_budget_message;
        for (const char* key : {"reasoning_budget_tokens", "thinking_budget_tokens"}) {
            if (!j.contains(key) || j[key].is_null()) continue;
            if (!j[key].is_number_integer() || j[key].get<int64_t>() < -1 ||
                j[key].get<int64_t>() > INT32_MAX)
                fail("'{}' must be -1 (no budget) or a number of tokens (got {})", key,
                     j[key].dump());
            budget = j[key].get<int32_t>();
        }
        if (j.contains("reasoning_budget_message") && !j["reasoning_budget_message"].is_null()) {
            if (!j["reasoning_budget_message"].is_string())
                fail("'reasoning_budget_message' must be a string");
            message = j["reasoning_budget_message"].get<std::string>();
        }
        if (budget >= 0)
            req.reasoning_budget =
                reasoning_budget_for(budget, message, prompt_opens_reasoning(out.prompt_text), tok);
    }
    return out;
}

std::shared_ptr<const ChatFormat> request_chat_for(const GgufFile& file, const Tokenizer& tok) {
    const ChatTemplateChoice c = chat_template_choose(file, "", "", false);
    if (!c.note.empty()) fmt::print(stderr, "kvrun: {}\n", c.note);
    return std::make_shared<const ChatFormat>(chat_format_make(c, tok));
}

nlohmann::json timings_to_json(const GenerationTimings& t) {
    return {{"queue_ms", t.queue_ms},
            {"ttft_ms", t.ttft_ms},
            {"prefill_ms", t.prefill_ms},
            {"decode_ms", t.decode_ms},
            {"prompt_tokens_computed", t.n_prompt_computed},
            {"prefill_tokens_per_s", t.prefill_tokens_per_s()},
            // null when the reply was too short or too quick for a rate (one speculative round)
            {"decode_tokens_per_s",
             t.has_decode_rate() ? nlohmann::json(t.decode_tokens_per_s()) : nlohmann::json()}};
}

nlohmann::json logprobs_to_json(const std::vector<TokenLogprobs>& lps, const Tokenizer& tok,
                                const std::vector<TokenId>& shown) {
    // The token's text may be part of a UTF-8 character (byte tokens): "bytes" is exact, and
    // "token" shows invalid UTF-8 as U+FFFD (json_line).
    auto one = [&](const TokenLogprob& t) {
        const std::string piece = token_piece_shown(tok, t.token, shown);
        return nlohmann::json{{"id", t.token},
                              {"token", piece},
                              {"bytes", std::vector<uint8_t>(piece.begin(), piece.end())},
                              {"logprob", t.logprob}};  // -inf is written as null
    };
    nlohmann::json out = nlohmann::json::array();
    for (const TokenLogprobs& lp : lps) {
        nlohmann::json x = one(lp.chosen);
        x["top_logprobs"] = nlohmann::json::array();
        for (const TokenLogprob& t : lp.top) x["top_logprobs"].push_back(one(t));
        out.push_back(std::move(x));
    }
    return out;
}

nlohmann::json generation_to_json(const GenerationResult& r, const Tokenizer& tok, bool speculative,
                                  bool special) {
    nlohmann::json x = {{"tokens", r.tokens},
                        {"text", tok.decode(r.tokens, false, special)},
                        {"stop", stop_reason_name(r.stop)},
                        {"preemptions", r.preemptions},
                        {"timings", timings_to_json(r.timings)}};
    if (speculative)
        x["speculative"] = {{"drafted", r.n_drafted},
                            {"accepted", r.n_accepted},
                            {"rounds", r.n_spec_rounds},
                            {"target_passes", r.n_target_passes}};
    if (!r.logprobs.empty()) x["logprobs"] = logprobs_to_json(r.logprobs, tok);
    if (r.stop == StopReason::Error) x["error"] = r.error;
    return x;
}

nlohmann::json request_result_to_json(const std::vector<GenerationResult>& samples,
                                      const std::vector<TokenId>& prompt_tokens,
                                      const Tokenizer& tok, bool speculative, bool special) {
    nlohmann::json out = samples.empty()
                             ? nlohmann::json::object()
                             : generation_to_json(samples[0], tok, speculative, special);
    out["prompt_tokens"] = prompt_tokens;
    if (samples.size() > 1) {
        out["samples"] = nlohmann::json::array();
        for (const auto& r : samples)
            out["samples"].push_back(generation_to_json(r, tok, speculative, special));
    }
    return out;
}

void add_stopping_words(nlohmann::json& result, const std::vector<std::string>& stops) {
    auto one = [&](nlohmann::json& g) {
        if (!g.is_object() || g.value("stop", "") != "stop" || !g.contains("text")) return;
        const std::string text = g["text"].get<std::string>();
        size_t best = std::string::npos;
        for (const std::string& s : stops) {
            const size_t at = s.empty() ? std::string::npos : text.find(s);
            if (at < best || (at == best && at != std::string::npos &&
                              s.size() > g["stopping_word"].get<std::string>().size())) {
                best = at;
                g["stopping_word"] = s;
            }
        }
        if (best != std::string::npos) g["text"] = text.substr(0, best);
    };
    one(result);
    if (result.contains("samples"))
        for (auto& g : result["samples"]) one(g);
}

std::string json_line(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvrun
