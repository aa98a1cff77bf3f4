// Reasoning blocks (reasoning.h): replies split into <think> reasoning and the answer, the
// stream's view always a prefix of the finished split, and over HTTP a thinking template's
// replies come back with "reasoning_content" apart, streamed the same as whole.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "grammar.h"
#include "modes/server_tools.h"
#include "reasoning.h"
#include "server_test_util.h"
#include "tool_templates.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

TEST_CASE("reasoning: replies split into reasoning and answer") {
    struct Case {
        const char* reply;
        bool opened;
        const char* reasoning;
        const char* content;
    };
    const Case cases[] = {
        {"No thinking here.", false, "", "No thinking here."},
        {"<think>\nWeigh it.\n</think>\n\nIt is 5.", false, "Weigh it.", "It is 5."},
        {"  <think>a</think>b", false, "a", "b"},
        {"Weigh it.</think>It is 5.", true, "Weigh it.", "It is 5."},
        {"\nStill weighing", true, "Still weighing", ""},  // cut short inside
        {"<think>Still weighing", false, "Still weighing", ""},
        {"<think></think>Answer", false, "", "Answer"},
        {"I say <think> late", false, "", "I say <think> late"},  // not first: text
        {"It is 5.", true, "It is 5.", ""},                       // opened, never closed
        // Granite 3.3 thinking: the answer between <response> tags.
        {"<think>Add them.</think>\n<response>It is 5.</response>", false, "Add them.", "It is 5."},
        {"<think>Add</think><response>\nIt is", false, "Add", "It is"},  // cut short
        {"<think>a</think><responses>b", false, "a", "<responses>b"},    // another word
        {"<response>No block, so kept</response>", false, "",
         "<response>No block, so kept</response>"},
        // Magistral's tags.
        {"[THINK]Add 2 and 3.[/THINK]\n\nIt is 5.", false, "Add 2 and 3.", "It is 5."},
        {" [THINK]Still adding", false, "Still adding", ""},
        {"[THINK]a</think>b[/THINK]c", false, "a</think>b", "c"},  // its own end tag only
        {"Weigh it.[/THINK]It is 5.", true, "Weigh it.", "It is 5."},
        {"Weigh [/THINK] then </think>", true, "Weigh", "then </think>"},  // the first end
        {"I say [THINK] late", false, "", "I say [THINK] late"},
        {"[THINK][/THINK][TOOL_CALLS]add[ARGS]{}", false, "", "[TOOL_CALLS]add[ARGS]{}"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.reply);
        const ReasoningSplit r = reasoning_split(c.reply, c.opened);
        CHECK(r.reasoning == c.reasoning);
        CHECK(r.content == c.content);
        // Streamed: every prefix shows a prefix of each final part, and never takes back.
        size_t shown_r = 0, shown_c = 0;
        const std::string reply = c.reply;
        for (size_t n = 0; n <= reply.size(); ++n) {
            const ReasoningSplit s = reasoning_stream(reply.substr(0, n), c.opened);
            CHECK(r.reasoning.compare(0, s.reasoning.size(), s.reasoning) == 0);
            CHECK(r.content.compare(0, s.content.size(), s.content) == 0);
            CHECK(s.reasoning.size() >= shown_r);
            CHECK(s.content.size() >= shown_c);
            shown_r = s.reasoning.size();
            shown_c = s.content.size();
        }
    }
    // Tags that are not whole yet wait.
    CHECK(reasoning_stream("<thi", false).content.empty());
    CHECK(reasoning_stream("Hmm </thi", true).reasoning == "Hmm");
    CHECK(reasoning_stream("<thumb", false).content == "<thumb");
    CHECK(reasoning_stream("<think>a</think><resp", false).content.empty());
    CHECK(reasoning_stream("<think>a</think><response>Yes</resp", false).content == "Yes");

    CHECK(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
    CHECK_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
    // Thinking switched off by the template (GLM 4.5, Qwen 3 with enable_thinking false).
    CHECK(prompt_closes_reasoning("<|assistant|>\n<think></think>"));
    CHECK(prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    CHECK_FALSE(prompt_closes_reasoning("<think>a plan</think>"));
    // DeepSeek V3.1 without thinking: a bare end tag after the assistant's marker.
    CHECK(prompt_closes_reasoning("<｜User｜>2+3?<｜Assistant｜></think>"));
    CHECK(
        prompt_closes_reasoning("<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>And "
                                "5?<｜Assistant｜></think>"));
    CHECK_FALSE(prompt_closes_reasoning("<｜User｜>2+3?<｜Assistant｜><think>"));
    CHECK_FALSE(prompt_closes_reasoning("<|im_start|>assistant\n<think>\n"));
    CHECK(chat_template_thinks(ChatTemplateKind::DeepSeek3, ""));
    CHECK_FALSE(chat_template_thinks(ChatTemplateKind::ChatML, ""));
    CHECK(chat_template_thinks(ChatTemplateKind::ChatML, "{{ '<think>' }}"));
    // Magistral.
    CHECK(reasoning_stream("[THI", false).content.empty());
    CHECK(reasoning_stream("[TOOL_CALLS]", false).content == "[TOOL_CALLS]");
    CHECK(reasoning_stream("Hmm [/THI", true).reasoning == "Hmm");
    CHECK(reasoning_stream("Hmm </thi", true).reasoning == "Hmm");
    CHECK(reasoning_stream("[THINK]Hmm [/TH", false).reasoning == "Hmm");
    CHECK(reasoning_stream("[THINK]Hmm </th", false).reasoning == "Hmm </th");
    CHECK(prompt_opens_reasoning("[INST]2+3?[/INST][THINK]"));
    CHECK(prompt_closes_reasoning("[INST]2+3?[/INST][THINK]\n[/THINK]"));
    CHECK_FALSE(prompt_closes_reasoning("[INST]2+3?[/INST][THINK]\n</think>"));
    CHECK(chat_template_thinks(ChatTemplateKind::Plain, "Think first: [THINK]...[/THINK]"));
}

TEST_CASE("reasoning: gpt-oss's harmony replies, by channel") {
    const struct {
        const char* reply;
        const char* reasoning;
        const char* content;
    } cases[] = {
        {"<|channel|>analysis<|message|>Add 2 and 3.<|end|><|start|>assistant<|channel|>final"
         "<|message|>It is 5.",
         "Add 2 and 3.", "It is 5."},
        {"<|channel|>final<|message|>Just this.", "", "Just this."},
        {"<|channel|>analysis<|message|>Cut short", "Cut short", ""},
        // A call is neither reasoning nor answer; a commentary preamble is for the user.
        {"<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
         "commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
         "Need the weather.", "Checking."},
        {"<|start|>assistant<|channel|>final<|message|>Hi", "", "Hi"},
        // The recipient right after the prompt's "<|start|>assistant": a call, no text.
        {" to=functions.add<|channel|>commentary json<|message|>{\"a\": 1}", "", ""},
    };
    for (const auto& c : cases) {
        CAPTURE(c.reply);
        const std::string reply = c.reply;
        CHECK(harmony_reply(reply));
        const ReasoningSplit r = reasoning_split(reply, false);
        CHECK(r.reasoning == c.reasoning);
        CHECK(r.content == c.content);
        size_t shown_r = 0, shown_c = 0;  // streamed: prefixes that never take back
        for (size_t n = 0; n <= reply.size(); ++n) {
            const ReasoningSplit st = reasoning_stream(reply.substr(0, n), false);
            CHECK(r.reasoning.compare(0, st.reasoning.size(), st.reasoning) == 0);
            CHECK(r.content.compare(0, st.content.size(), st.content) == 0);
            CHECK(st.reasoning.size() >= shown_r);
            CHECK(st.content.size() >= shown_c);
            shown_r = st.reasoning.size(), shown_c = st.content.size();
        }
    }
    // Headers: channel, recipient (in the channel's part or the role's), content type.
    const std::vector<HarmonyMessage> m = harmony_messages(
        "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{}<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"a\""
        ":1}");
    REQUIRE(m.size() == 2);
    CHECK(m[0].channel == "commentary");
    CHECK(m[0].recipient == "functions.add");
    CHECK(m[0].content_type == "json");
    CHECK(m[0].closed);
    CHECK(m[1].recipient == "functions.get_weather");
    CHECK(m[1].content_type == "json");
    CHECK(m[1].text == "{\"a\":1}");
    CHECK_FALSE(m[1].closed);
    CHECK(harmony_messages("<|channel|>analysis<|mess").empty());  // header not whole yet
    CHECK_FALSE(harmony_reply("Plain <|channel|> text"));
    CHECK(reasoning_split("Plain <|channel|> text", false).content == "Plain <|channel|> text");
    CHECK(chat_template_thinks(ChatTemplateKind::Plain, "x<|channel|>analysis<|message|>y"));
}

TEST_CASE("reasoning styler: the reasoning marked apart, then the answer, however it streams") {
    const struct {
        std::string reply;
        bool opened;
        std::string shown;
    } cases[] = {
        {"<think>\nAdd them.\n</think>\n\nIt is 5.", false, "[Add them.]\n\nIt is 5."},
        {"Add them.</think>It is 5.", true, "[Add them.]\n\nIt is 5."},
        {"It is 5.", false, "It is 5."},
        {"<think>cut short", false, "[cut short]"},
        {"<think></think>Only this.", false, "Only this."},
    };
    std::mt19937 rng(3);
    for (const auto& c : cases)
        for (int split = 0; split < 20; ++split) {
            CAPTURE(c.reply);
            ReasoningStyler st(c.opened, "[", "]");
            std::string out;
            for (size_t at = 0; at < c.reply.size();) {
                const size_t n = split == 0 ? c.reply.size() : 1 + rng() % 4;
                out += st.add(std::string_view(c.reply).substr(at, n));
                at += n;
            }
            out += st.finish();
            CHECK(out == c.shown);
        }
}

namespace {

// ChatML whose generation prompt opens a reasoning block (as DeepSeek R1's and Qwen 3's do).
const char* const kThinkingChatml = R"tmpl({% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
<think>
{% endif %})tmpl";

struct Streamed {
    std::string reasoning, content;
    int reasoning_chunks = 0;
};

Streamed stream(Running& run, json body) {
    body["stream"] = true;
    Streamed s;
    for (const std::string& e : sse_data(run.post("/v1/chat/completions", body).body)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        if (d.contains("reasoning_content")) {
            s.reasoning += d["reasoning_content"].get<std::string>();
            ++s.reasoning_chunks;
        }
        if (d.contains("content") && d["content"].is_string())
            s.content += d["content"].get<std::string>();
    }
    return s;
}

// A reply the request's grammar makes think and then answer: its reasoning and its answer
// come back apart, neither with the tag's `word`, the answer ending with ".", and a stream
// gives the same two texts.
std::pair<json, Streamed> check_apart(Running& run, const json& body, const std::string& word) {
    const json m =
        json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    REQUIRE(m.contains("reasoning_content"));
    const std::string reasoning = m["reasoning_content"], content = m["content"];
    CAPTURE(reasoning);
    CAPTURE(content);
    CHECK(reasoning.size() >= 4);
    CHECK(content.size() >= 5);
    CHECK(content.back() == '.');
    CHECK(content.find(word) == std::string::npos);
    CHECK(reasoning.find(word) == std::string::npos);
    const Streamed st = stream(run, body);
    CHECK(st.reasoning == reasoning);
    CHECK(st.content == content);
    return {m, st};
}

}  // namespace

TEST_CASE("server: reasoning_content apart from the answer, whole and streamed") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/1024);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(kThinkingChatml)));
    Running run(cfg, s);
    // A grammar makes the story model close its reasoning and answer after it.
    json body = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                 {"grammar", R"(root ::= [a-z ]{8,30} "</think>" " " [a-z ]{4,20} ".")"},
                 {"max_tokens", 120},
                 {"temperature", 0}};
    const auto [m, st] = check_apart(run, body, "think");
    const std::string reasoning = m["reasoning_content"], content = m["content"];
    CHECK(st.reasoning_chunks > 1);  // reasoning streams as it comes

    // reasoning_format "none": one whole content, tag and all.
    body["reasoning_format"] = "none";
    const json whole =
        json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    CHECK(!whole.contains("reasoning_content"));
    const std::string all = whole["content"];
    CHECK(all.find(reasoning + "</think> " + content) != std::string::npos);
    CHECK(stream(run, body).content == whole["content"].get<std::string>());
    // deepseek-legacy: the reasoning apart, and the content whole as with none.
    body["reasoning_format"] = "deepseek-legacy";
    const json legacy =
        json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    CHECK(legacy["reasoning_content"] == reasoning);
    CHECK(legacy["content"] == all);
    const Streamed legacy_stream = stream(run, body);
    CHECK(legacy_stream.reasoning == reasoning);
    CHECK(legacy_stream.content == all);
    body["reasoning_format"] = "sideways";
    CHECK(run.post("/v1/chat/completions", body).status == 400);
}

TEST_CASE("server: templates that do not think keep replies whole") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/1024);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    Running run(cfg, s);
    const json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                       {"grammar", R"(root ::= "<think>" [a-z ]{3,10} "</think>" [a-z ]{3,10})"},
                       {"max_tokens", 60},
                       {"temperature", 0}};
    const json m =
        json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    CHECK(!m.contains("reasoning_content"));
    CHECK(m["content"].get<std::string>().rfind("<think>", 0) == 0);
}

TEST_CASE("server: a built-in format standing in for a thinking template splits reasoning") {
    // Qwen 3 without --jinja: ChatML renders its chats, but its template (and so the model)
    // thinks — chat_template_choose says so, and replies come with their reasoning apart.
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/1024);
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::ChatML);
    cfg.api.chat.thinks = true;
    Running run(cfg, s);
    json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"grammar", R"(root ::= "<think>" [a-z ]{3,10} "</think>" [a-z ]{3,10})"},
                 {"max_tokens", 60},
                 {"temperature", 0}};
    const json m =
        json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    REQUIRE(m.contains("reasoning_content"));
    CHECK(!m["reasoning_content"].get<std::string>().empty());
    CHECK(m["content"].get<std::string>().find("think") == std::string::npos);
    const Streamed st = stream(run, body);
    CHECK(st.reasoning == m["reasoning_content"]);
    CHECK(st.content == m["content"]);
}

TEST_CASE("server: chat_template_kwargs reach the template (enable_thinking)") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/1024);
    ServerConfig cfg = s.config();
    // Qwen 3's switch, in a template written for this test.
    s.set_chat(cfg, ChatTemplateKind::ChatML,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(
                   R"({% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %})")));
    cfg.api.template_kwargs = {{"style", "unused"}};
    Running run(cfg, s);
    const json messages = {{{"role", "user"}, {"content", "Tell me a story."}}};
    auto prompt = [&](const json& extra) {
        json body = {{"messages", messages}};
        if (!extra.is_null()) body.update(extra);
        const HttpReply r = run.post("/apply-template", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        return json::parse(r.body)["prompt"].get<std::string>();
    };
    CHECK(prompt({}).ends_with("<think>\n"));
    CHECK(prompt({{"chat_template_kwargs", {{"enable_thinking", false}}}})
              .ends_with("<think>\n\n</think>\n\n"));
    CHECK(prompt({{"chat_template_kwargs", {{"enable_thinking", true}}}}).ends_with("<think>\n"));

    // Thinking off: the reply is all answer; on (the default), the story is all reasoning.
    json body = {{"messages", messages}, {"max_tokens", 20}, {"temperature", 0}};
    json m = json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    CHECK(m.contains("reasoning_content"));
    CHECK(m["content"] == "");
    body["chat_template_kwargs"] = {{"enable_thinking", false}};
    m = json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    CHECK(!m.contains("reasoning_content"));
    CHECK(!m["content"].get<std::string>().empty());

    // Misuse: one clear 400 each.
    body["chat_template_kwargs"] = "enable_thinking";
    HttpReply r = run.post("/v1/chat/completions", body);
    CHECK(r.status == 400);
    CHECK(r.body.find("must be an object") != std::string::npos);
    body["chat_template_kwargs"] = {{"messages", json::array()}};
    r = run.post("/v1/chat/completions", body);
    CHECK(r.status == 400);
    CHECK(r.body.find("cannot set 'messages'") != std::string::npos);
}

TEST_CASE("server: a required tool call may follow reasoning the prompt opened") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/1024);
    ServerConfig cfg = s.config();
    // The thinking ChatML with the Hermes tool syntax (in a comment: detection only).
    s.set_chat(cfg, ChatTemplateKind::ChatML,
               std::make_shared<const JinjaTemplate>(
                   JinjaTemplate::parse(std::string(kThinkingChatml) + "{# <tool_call> #}")));
    Running run(cfg, s);
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}])");
    // The grammar lets the reasoning come first; the story model never closes it, so
    // max_tokens cuts the reply inside its reasoning.
    const HttpReply r = run.post("/v1/chat/completions",
                                 {{"messages", {{{"role", "user"}, {"content", "Add 2 and 3."}}}},
                                  {"tools", tools},
                                  {"tool_choice", "required"},
                                  {"max_tokens", 20},
                                  {"temperature", 0}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json m = json::parse(r.body)["choices"][0]["message"];
    CHECK(!m["reasoning_content"].get<std::string>().empty());
    CHECK(!m.contains("tool_calls"));
}

TEST_CASE("server: Magistral's [THINK] blocks: reasoning apart, budget, then tool calls") {
    // Mistral's reasoning models write [THINK]...[/THINK] (control tokens of their vocabulary)
    // before the answer or the [TOOL_CALLS]: stories260K with four byte tokens it never uses
    // renamed to those tags, under a Mistral v11 template whose system prompt asks for them.
    const std::string path = model_path();
    if (path.empty()) return;
    const std::string model = with_control_tokens(path,
                                                  {{"<0x03>", "[THINK]"},
                                                   {"<0x04>", "[/THINK]"},
                                                   {"<0x05>", "[TOOL_CALLS]"},
                                                   {"<0x06>", "[ARGS]"}},
                                                  "kvrun-test-magistral-tokens.gguf");
    Served s(model, /*n_ctx=*/1024);
    const Tokenizer& tok = *s.m.tokenizer;
    const TokenId open = tok.find_token("[THINK]");
    CHECK_FALSE(tok.is_control(open));  // shown as its text
    CHECK(tok.token_to_piece(open) == "[THINK]");
    CHECK(tok.is_control(tok.find_token("[TOOL_CALLS]")));
    CHECK(reasoning_tags(tok).open == "[THINK]");
    CHECK(reasoning_tags(tok).close == "[/THINK]");
    const std::string tmpl =
        std::string(
            "[SYSTEM_PROMPT]Draft your thinking between [THINK] and [/THINK], then "
            "answer.[/SYSTEM_PROMPT]") +
        kMistralV11;
    ServerConfig cfg = s.config();
    s.set_chat(cfg, ChatTemplateKind::Plain,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(tmpl)));
    CHECK(cfg.api.chat.thinks);
    CHECK(tool_format_detect(tmpl) == ToolFormat::MistralV11);
    Running run(cfg, s);
    json body = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                 {"grammar", R"(root ::= "[THINK]" [a-z ]{8,30} "[/THINK]" [a-z ]{4,20} ".")"},
                 {"max_tokens", 120},
                 {"temperature", 0}};
    check_apart(run, body, "THINK");

    // A budget of 3 tokens: the forced end tag is [/THINK] (one token here), then the answer.
    // (The reasoning is then a shorter prefix of the unbudgeted one.)
    body["grammar"] = R"(root ::= "[THINK]" [a-z ]+ "[/THINK]" [a-z ]+ ".")";
    body["max_tokens"] = 40;
    const json free =
        json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    body["reasoning_budget_tokens"] = 3;
    const json b =
        json::parse(run.post("/v1/chat/completions", body).body)["choices"][0]["message"];
    CAPTURE(free.dump());
    CAPTURE(b.dump());
    REQUIRE(b.contains("reasoning_content"));
    const std::string cut = b["reasoning_content"], whole = free.value("reasoning_content", "");
    CHECK(!cut.empty());
    CHECK(cut.size() < whole.size());
    CHECK(whole.starts_with(cut));
    CHECK(b["content"].get<std::string>().size() >= 2);

    // A required call may come after a [THINK] block, not after a <think> one.
    const json tools = json(weather_and_add());
    const ChatTools ct = tools_for(ToolFormat::MistralV11, "required");
    // (Here the tags are tokens: the grammar names them by id.)
    const auto id = [&](const char* text) { return fmt::format("<[{}]>", tok.find_token(text)); };
    const std::string optional = chat_tools_grammar(ct, tok, ToolThinking::Optional).gbnf;
    CHECK(optional.find("root ::= (" + id("[THINK]") + " think-text " + id("[/THINK]")) !=
          std::string::npos);
    CHECK(optional.find("<think>") == std::string::npos);
    const std::string opened = chat_tools_grammar(ct, tok, ToolThinking::Open).gbnf;
    CHECK(opened.find("root ::= think-text " + id("[/THINK]")) != std::string::npos);
    REQUIRE(Grammar::parse(optional));
    REQUIRE(Grammar::parse(opened));
    // Over HTTP: the reply's reasoning apart and its call.
    const HttpReply r =
        run.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Add 2."}}}},
                                          {"tools", tools},
                                          {"tool_choice", "required"},
                                          {"max_tokens", 60},
                                          {"temperature", 0},
                                          {"reasoning_budget_tokens", 2}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json choice = json::parse(r.body)["choices"][0];
    CAPTURE(choice.dump());
    CHECK(choice["finish_reason"] == "tool_calls");
    CHECK(choice["message"]["tool_calls"][0]["function"]["name"] == "add");
}
