// Chat formats through the Jinja interpreter (chat_template_apply_jinja, chat_template_choose):
// Jinja renditions of built-in formats give the built-in text exactly; which format a command
// picks (--chat-template, --chat-template-file, --jinja, an unknown model template); the
// server and a multi-turn ChatSession with a Jinja template give what the built-in format
// gives, and a template that rewrites earlier turns still shows the model exactly its
// rendering of the conversation.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "chat_session.h"
#include "chat_template.h"
#include "gguf_writer.h"
#include "modes/request_json.h"
#include "server_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

namespace {

// Written here in the style of the models' own templates.
const char* kChatmlJinja =
    "{%- for m in messages -%}\n"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

const char* kLlama3Jinja =
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

// ChatML that shows earlier replies only by their first word (a template that rewrites the
// history, as reasoning models' templates drop earlier thoughts).
const char* kRewritingJinja =
    "{%- for m in messages -%}\n"
    "{%- set text = m['content'] -%}\n"
    "{%- if m['role'] == 'assistant' -%}{%- set text = (text.split(' ') | first) -%}{%- endif -%}\n"
    "{{- '<|im_start|>' + m['role'] + '\\n' + text + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

std::vector<std::vector<ChatMessage>> conversations() {
    return {{{"system", "You are terse."},
             {"user", "Hi there"},
             {"assistant", "Hello! How can I help?"},
             {"user", "Tell me a joke."}},
            {{"user", "  spaced  "}, {"assistant", "ok"}},
            {{"user", "unicode: héllo → 世界 🙂"}}};
}

std::string gguf_with_template(const std::string& name, const std::string& tmpl) {
    const auto path = std::filesystem::temp_directory_path() / name;
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    if (!tmpl.empty()) w.set_string("tokenizer.chat_template", tmpl);
    w.write_file(path.string());
    return path.string();
}

}  // namespace

TEST_CASE("jinja: renditions of ChatML and Llama 3 give the built-in formats' text") {
    const JinjaTemplate chatml = JinjaTemplate::parse(kChatmlJinja);
    const JinjaTemplate llama3 = JinjaTemplate::parse(kLlama3Jinja);
    ChatSpecialTexts special;
    special.bos = "<|begin_of_text|>";
    for (const auto& msgs : conversations())
        for (bool gen : {true, false}) {
            CAPTURE(msgs.size());
            CAPTURE(gen);
            CHECK(chat_template_apply_jinja(chatml, msgs, gen, special) ==
                  chat_template_apply(ChatTemplateKind::ChatML, msgs, gen, special));
            // The template writes BOS first; the text leaves it to the tokenizer.
            CHECK(chat_template_apply_jinja(llama3, msgs, gen, special) ==
                  chat_template_apply(ChatTemplateKind::Llama3, msgs, gen, special));
        }
    // What the template raises is an Error.
    const JinjaTemplate strict = JinjaTemplate::parse(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('users first') }}{% endif %}");
    CHECK_THROWS_WITH_AS(chat_template_apply_jinja(strict, {{"assistant", "x"}}, true),
                         doctest::Contains("users first"), Error);
}

TEST_CASE("jinja: which chat format a command uses") {
    const std::string known = gguf_with_template("kvrun-test-tmpl-known.gguf", kChatmlJinja);
    const std::string unknown =
        gguf_with_template("kvrun-test-tmpl-unknown.gguf",
                           "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
    const std::string broken = gguf_with_template("kvrun-test-tmpl-broken.gguf", "{% for %}");
    const std::string none = gguf_with_template("kvrun-test-tmpl-none.gguf", "");
    const auto tmpl_file = std::filesystem::temp_directory_path() / "kvrun-test-tmpl.jinja";
    std::ofstream(tmpl_file) << kLlama3Jinja;

    GgufFile k = GgufFile::open(known), u = GgufFile::open(unknown), b = GgufFile::open(broken),
             n = GgufFile::open(none);
    ChatTemplateChoice c = chat_template_choose(k, "", "", false);  // a known format: built in
    CHECK(c.kind == ChatTemplateKind::ChatML);
    CHECK(!c.jinja);
    CHECK(c.name() == "chatml");
    c = chat_template_choose(k, "", "", true);  // --jinja: the model's own, stops still ChatML's
    CHECK(c.jinja);
    CHECK(c.kind == ChatTemplateKind::ChatML);
    CHECK(c.name() == "jinja");
    CHECK_FALSE(c.thinks);
    // Qwen 3's kind of template: built-in ChatML renders it, and its replies think.
    const std::string qwen3 =
        gguf_with_template("kvrun-test-tmpl-qwen3.gguf",
                           std::string(kChatmlJinja) +
                               "{% if enable_thinking is defined %}<think>\n\n</think>{% endif %}");
    GgufFile q = GgufFile::open(qwen3);
    c = chat_template_choose(q, "", "", false);
    CHECK(c.kind == ChatTemplateKind::ChatML);
    CHECK(!c.jinja);
    CHECK(c.thinks);
    CHECK(chat_template_choose(q, "", "", true).thinks);
    CHECK_FALSE(chat_template_choose(q, "chatml", "", false).thinks);  // a name: the format's own
    CHECK(chat_template_choose(q, "deepseek3", "", false).thinks);
    c = chat_template_choose(k, "llama2", "", true);  // a name wins
    CHECK(c.kind == ChatTemplateKind::Llama2);
    CHECK(!c.jinja);
    c = chat_template_choose(n, "", tmpl_file.string(), false);  // a file
    REQUIRE(c.jinja);
    CHECK(c.kind == ChatTemplateKind::Llama3);
    CHECK(c.jinja->source() == kLlama3Jinja);
    c = chat_template_choose(u, "", "", false);  // unknown to detection: the interpreter
    REQUIRE(c.jinja);
    CHECK(c.kind == ChatTemplateKind::Plain);
    CHECK(c.note.find("Jinja interpreter") != std::string::npos);
    CHECK(chat_template_apply_jinja(*c.jinja, {{"user", "hi"}}, true) == "[user] hi\n");
    c = chat_template_choose(b, "", "", false);  // does not parse: plain, with a note
    CHECK(!c.jinja);
    CHECK(c.note.find("does not parse") != std::string::npos);
    CHECK_THROWS_WITH_AS(chat_template_choose(b, "", "", true), doctest::Contains("does not parse"),
                         Error);
    CHECK_THROWS_WITH_AS(chat_template_choose(n, "", "", true),
                         doctest::Contains("has no chat template"), Error);
    CHECK_THROWS_WITH_AS(chat_template_choose(n, "chatml", tmpl_file.string(), false),
                         doctest::Contains("not both"), Error);
    CHECK_THROWS_AS(chat_template_choose(n, "", "/nonexistent/t.jinja", false), Error);
    for (const std::string& p : {known, unknown, broken, none, tmpl_file.string()})
        std::filesystem::remove(p);
}

TEST_CASE("jinja: the server and a multi-turn chat give what the built-in format gives") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/1024, /*parallel=*/2);
    const auto chatml = std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(kChatmlJinja));
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    const json body = {{"messages",
                        {{{"role", "system"}, {"content", "You tell stories."}},
                         {{"role", "user"}, {"content", "Tell me about a cat."}}}},
                       {"max_tokens", 16},
                       {"temperature", 0}};
    json builtin, jinja;
    {
        Running run(cfg, s);
        builtin = json::parse(run.post("/v1/chat/completions", body).body);
    }
    cfg.api.chat.jinja = chatml;
    {
        Running run(cfg, s);
        jinja = json::parse(run.post("/v1/chat/completions", body).body);
        CHECK(json::parse(run.post("/apply-template", body).body)["prompt"] ==
              chat_template_apply(
                  ChatTemplateKind::ChatML,
                  {{"system", "You tell stories."}, {"user", "Tell me about a cat."}}, true));
        CHECK(json::parse(run.get("/props").body)["chat_template"] == kChatmlJinja);
    }
    CHECK(jinja["choices"][0]["message"]["content"] == builtin["choices"][0]["message"]["content"]);
    CHECK(jinja["usage"] == builtin["usage"]);

    // Multi-turn: the same replies and the same conversation tokens, each turn prefilling
    // only its new tokens.
    ChatConfig cc;
    cc.chat_template.kind = ChatTemplateKind::ChatML;
    cc.n_predict = 12;
    cc.sampling.temperature = 0;
    cc.system = "You tell stories.";
    const std::vector<std::string> turns = {"Tell me about a cat.", "And a dog?", "Why?"};
    auto talk = [&](const ChatConfig& config, std::vector<ChatTurnStats>* stats) {
        ChatSession chat(*s.engine, *s.m.tokenizer, config);
        std::vector<std::string> replies;
        for (const std::string& t : turns) {
            std::string reply;
            chat.send(
                t, [&](std::string_view x) { reply += x; }, [](std::string_view) {});
            replies.push_back(reply);
            if (stats) stats->push_back(chat.last_turn());
        }
        return std::make_pair(replies, chat.tokens());
    };
    const auto [want, want_tokens] = talk(cc, nullptr);
    ChatConfig cj = cc;
    cj.chat_template.jinja = chatml;
    std::vector<ChatTurnStats> stats;
    const auto [got, got_tokens] = talk(cj, &stats);
    CHECK(got == want);
    CHECK(got_tokens == want_tokens);
    for (size_t i = 1; i < stats.size(); ++i) CHECK(stats[i].n_reused > 0);

    // A template that rewrites earlier replies: the model sees exactly its rendering.
    ChatConfig cr = cc;
    cr.chat_template.jinja =
        std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(kRewritingJinja));
    ChatSession chat(*s.engine, *s.m.tokenizer, cr);
    for (const std::string& t : turns) {
        chat.send(
            t, [](std::string_view) {}, [](std::string_view) {});
        std::vector<ChatMessage> before = chat.messages();
        before.pop_back();  // the reply
        const std::vector<TokenId> prompt =
            s.m.tokenizer->encode(chat_template_apply_jinja(*cr.chat_template.jinja, before, true,
                                                            chat_special_texts(*s.m.tokenizer)),
                                  s.m.tokenizer->add_bos(), true);
        REQUIRE(chat.tokens().size() >= prompt.size());
        CHECK(std::equal(prompt.begin(), prompt.end(), chat.tokens().begin()));
    }
}

TEST_CASE("JSONL requests (run --jsonl, batch) take 'messages' in the model's chat format") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, 512, 1);
    const Tokenizer& tok = *s.m.tokenizer;
    const auto chat = std::make_shared<const ChatFormat>(
        s.chat_format(ChatTemplateKind::ChatML,
                      std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(kChatmlJinja))));
    RequestDefaults d;
    d.chat = chat;
    const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
    const ParsedRequest p = request_from_json(
        R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "n_predict": 4})",
        d, tok);
    CHECK(p.request.prompt ==
          tok.encode(chat_template_apply(ChatTemplateKind::ChatML, msgs, true, chat->special),
                     tok.add_bos(), true));
    CHECK(p.request.stop_tokens == chat->stops.tokens);
    for (const std::string& st : chat->stops.strings)
        CHECK(std::find(p.request.stop_strings.begin(), p.request.stop_strings.end(), st) !=
              p.request.stop_strings.end());
    CHECK(p.request.n_predict == 4);
    RequestDefaults none;
    CHECK_THROWS_WITH_AS(
        request_from_json(R"({"messages": [{"role": "user", "content": "Hi"}]})", none, tok),
        doctest::Contains("needs a chat format"), Error);

    // The executables: the same prompt tokens as the rendered text (the model's format).
    const std::string rendered =
        chat_template_apply(chat_template_choose(*s.m.file, "", "", false).kind,
                            {{"user", "Tell me a story."}}, true, chat->special);
    const std::string line =
        R"({"messages": [{"role": "user", "content": "Tell me a story."}], "n_predict": 6, "temperature": 0})";
    for (const std::string& mode : {std::string("run --jsonl"), std::string("batch")}) {
        CAPTURE(mode);
        const auto r = kvrun::test::run_command(
            kvrun::test::kvrun_binary() + " " + mode + " -m " + path + " -c 256", line + "\n");
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const json out = json::parse(r.out.substr(0, r.out.find('\n')));
        CHECK(out["prompt_tokens"] == tok.encode(rendered, tok.add_bos(), true));
    }
}
