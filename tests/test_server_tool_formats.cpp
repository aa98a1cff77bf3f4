// Tool calls in a model family's own syntax (ToolFormat, server_tool_formats.cpp): which
// templates show which syntax; the template renders the tools, earlier calls and results
// exactly as Python's jinja2 does (the expected texts come from jinja2 3.1.6 on the same
// templates); each format's grammar admits exactly calls of listed tools; replies are read
// back (text before Hermes calls, Mistral's 9-character ids); and a stream shows only content
// that the final reply keeps. Over HTTP: test_server_tool_http.cpp.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "chat_template.h"
#include "grammar.h"
#include "json_schema.h"
#include "modes/server_tools.h"
#include "server_test_util.h"
#include "tool_templates.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

TEST_CASE("tool formats: detected from the template's own syntax") {
    CHECK(tool_format_detect(kHermes) == ToolFormat::Hermes);
    CHECK(tool_format_detect(kLlama3) == ToolFormat::Llama3);
    CHECK(tool_format_detect(kMistral) == ToolFormat::MistralNemo);
    CHECK(tool_format_detect(kMistralV11) == ToolFormat::MistralV11);
    CHECK(std::string(tool_format_name(ToolFormat::MistralV11)) == "mistral-v11");
    CHECK(tool_format_detect(kQwen3Coder) == ToolFormat::Qwen3Coder);
    CHECK(std::string(tool_format_name(ToolFormat::Qwen3Coder)) == "qwen3-coder");
    CHECK(tool_format_detect(kDeepSeekR1) == ToolFormat::DeepSeekR1);
    CHECK(tool_format_detect(kHarmony) == ToolFormat::Harmony);
    CHECK(tool_format_detect(kGranite) == ToolFormat::Granite);
    CHECK(std::string(tool_format_name(ToolFormat::Granite)) == "granite");
    CHECK(std::string(tool_format_name(ToolFormat::Harmony)) == "gpt-oss");
    CHECK(std::string(tool_format_name(ToolFormat::DeepSeekR1)) == "deepseek-r1");
    CHECK(tool_format_detect("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}") ==
          ToolFormat::Generic);
    // Llama 3 headers alone (Llama 3.0, no tool role) are not the tool syntax.
    CHECK(tool_format_detect("<|start_header_id|>{{ m.role }}<|end_header_id|>") ==
          ToolFormat::Generic);
    CHECK(std::string(tool_format_name(ToolFormat::MistralNemo)) == "mistral-nemo");
}

TEST_CASE("tool formats: the template writes tools, calls and results as jinja2 does") {
    const ojson msgs = chat_messages_native(ojson::parse(kHistory));
    // OpenAI's shape kept: the call's arguments as an object, the result named after its call.
    CHECK(msgs[2]["tool_calls"][0]["function"]["arguments"] == ojson{{"a", 2}, {"b", 3}});
    CHECK(msgs[2]["tool_calls"][0]["id"] == "abcDEF123");
    CHECK(msgs[3]["name"] == "add");
    ojson with_reasoning = ojson::parse(kHistory);
    with_reasoning[2]["reasoning_content"] = "Add them.";
    CHECK(chat_messages_native(with_reasoning)[2]["reasoning_content"] == "Add them.");
    CHECK(!msgs[2].contains("reasoning_content"));
    CHECK(msgs[3]["tool_call_id"] == "abcDEF123");
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
        "description": "Adds.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}])");
    const struct {
        const char* source;
        const char* expected;
    } cases[] = {
        {kHermes,
         "<|im_start|>system\nBe brief.\n\nYou may call functions. Their "
         "signatures:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"add\", "
         "\"description\": \"Adds.\", \"parameters\": {\"type\": \"object\", \"properties\": "
         "{\"a\": {\"type\": \"integer\"}}}}}\n</tools>\nCall one as <tool_call>\n{\"name\": "
         "<name>, \"arguments\": "
         "<arguments>}\n</"
         "tool_call><|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n<tool_"
         "call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": "
         "3}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</"
         "tool_response><|im_end|>\n<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n"},
        {kLlama3,
         "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nTo call a function, "
         "reply with {\"name\": <name>, \"parameters\": <arguments>} and nothing else. The "
         "functions:\n{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": "
         "\"Adds.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
         "\"integer\"}}}}}\nBe "
         "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+3?<|eot_id|><|start_header_"
         "id|>assistant<|end_header_id|>\n\n{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": "
         "3}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|><|start_header_id|"
         ">user<|end_header_id|>\n\nAnd "
         "4+4?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {kMistral,
         "[INST]2+3?[/INST][TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}, "
         "\"id\": \"abcDEF123\"}]</s>[TOOL_RESULTS]{\"content\": \"5\", \"call_id\": "
         "\"abcDEF123\"}[/TOOL_RESULTS][AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": "
         "{\"name\": \"add\", \"description\": \"Adds.\", \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"a\": {\"type\": \"integer\"}}}}}][/AVAILABLE_TOOLS][INST]And "
         "4+4?[/INST]"},
        {kMistralV11,
         "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]2+3?[/INST][TOOL_CALLS]add[ARGS]{\"a\": 2, "
         "\"b\": 3}</s>[TOOL_RESULTS]5[/TOOL_RESULTS][AVAILABLE_TOOLS][{\"type\": \"function\", "
         "\"function\": {\"name\": \"add\", \"description\": \"Adds.\", \"parameters\": "
         "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
         "\"integer\"}}}}}][/AVAILABLE_TOOLS][INST]And 4+4?[/INST]"},
        {kQwen3Coder,
         "<|im_start|>system\nBe "
         "brief.\nFunctions:\n<tools><function><name>add</name><parameter><name>"
         "a</name><type>integer</type></parameter></function></tools>\nCall one as <tool_call>\n"
         "<function=NAME>\n<parameter=NAME>\nVALUE\n</parameter>\n</function>\n</"
         "tool_call><|im_end|>"
         "\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant<tool_call>\n<function=add>\n"
         "<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n</function>\n</tool_call>"
         "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<|im_end|>\n"
         "<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n"},
    };
    for (const auto& c : cases) {
        const JinjaTemplate t = JinjaTemplate::parse(c.source);
        CHECK(chat_template_apply_jinja(t, msgs, tools, true, {}) == c.expected);
    }
    // DeepSeek R1's template adds the arguments to a string: objects fail as in jinja2, and
    // the arguments as JSON text (what the server falls back to) render as jinja2 renders
    // OpenAI's strings.
    const JinjaTemplate r1 = JinjaTemplate::parse(kDeepSeekR1);
    CHECK_THROWS_WITH_AS(chat_template_apply_jinja(r1, msgs, tools, true, {}),
                         doctest::Contains("can only concatenate"), Error);
    const ojson as_text = chat_messages_arguments_as_text(msgs);
    CHECK(as_text[2]["tool_calls"][0]["function"]["arguments"] == R"({"a":2,"b":3})");
    CHECK(
        chat_template_apply_jinja(r1, as_text, tools, true, {}) ==
        "Be brief.\n## Tools\n{\"name\": \"add\", \"description\": \"Adds.\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
        "\"integer\"}}}}\n<｜User｜>2+3?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
        "function<｜tool▁sep｜>add\n```json\n{\"a\":2,\"b\":3}\n```<｜tool▁call▁end｜><｜tool"
        "▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>5<｜tool"
        "▁output▁end｜><｜tool▁outputs▁end｜><｜User｜>And 4+4?<｜Assistant｜>");
    CHECK(chat_messages_arguments_as_text(as_text) == as_text);

    // Qwen3-Coder's values: a string as it is, lists and objects as JSON; results together.
    const ojson coder_history = chat_messages_native(ojson::parse(R"([
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "x", "type": "function",
          "function": {"name": "get_weather",
            "arguments": "{\"city\": \"Oslo\", \"days\": [1, 2], \"opts\": {\"k\": \"v\"}, \"n\": 2.5}"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "y", "content": "Cold"}])"));
    CHECK(chat_template_apply_jinja(JinjaTemplate::parse(kQwen3Coder), coder_history,
                                    ojson::array(), false, {}) ==
          "<|im_start|>user\nOslo?<|im_end|>\n<|im_start|>assistant<tool_call>\n<function=get_"
          "weather>\n"
          "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n[1, 2]\n</parameter>\n"
          "<parameter=opts>\n{\"k\": \"v\"}\n</parameter>\n<parameter=n>\n2.5\n</parameter>\n"
          "</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nSunny\n"
          "</tool_response>\n<tool_response>\nCold\n</tool_response>\n<|im_end|>\n");
    // Mistral's template refuses an id that is not 9 characters: ours always are.
    ojson bad = ojson::parse(kHistory);
    bad[2]["tool_calls"][0]["id"] = "call_1";
    CHECK_THROWS_WITH_AS(chat_template_apply_jinja(JinjaTemplate::parse(kMistral),
                                                   chat_messages_native(bad), tools, true, {}),
                         "tool call ids must be 9 letters or digits", Error);
    // The checks of chat_messages_from_json hold here too.
    CHECK_THROWS_WITH_AS(
        chat_messages_native(ojson::parse(R"([{"role": "robot", "content": "x"}])")),
        doctest::Contains("role 'robot' is not supported"), Error);
}

TEST_CASE("tool formats: each grammar admits exactly calls of listed tools in its syntax") {
    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    auto grammar = [&](const ChatTools& t) {
        return Grammar::parse(chat_tools_grammar(t, *tok).gbnf);
    };
    const std::string weather =
        R"({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}})";
    const std::string add = R"({"name": "add", "arguments": {"a": 2, "b": 3}})";
    const std::string not_listed = R"({"name": "rm", "arguments": {}})";
    const std::string bad_args = R"({"name": "add", "arguments": {"a": "two", "b": 3}})";

    // Hermes: one block or several; with "auto" the grammar waits for "<tool_call>".
    auto hermes = grammar(tools_for(ToolFormat::Hermes));
    auto block = [](const std::string& call) { return "<tool_call>\n" + call + "\n</tool_call>"; };
    CHECK(grammar_accepts(*hermes, block(weather)));
    CHECK(grammar_accepts(*hermes, block(weather) + "\n" + block(add)));
    CHECK(grammar_accepts(*hermes, "<tool_call>" + add + "</tool_call>"));
    CHECK_FALSE(grammar_accepts(*hermes, block(not_listed)));
    CHECK_FALSE(grammar_accepts(*hermes, block(bad_args)));
    CHECK_FALSE(grammar_accepts(*hermes, add));
    const ToolGrammar hermes_auto = chat_tools_grammar(tools_for(ToolFormat::Hermes), *tok);
    CHECK(hermes_auto.triggers == json::parse(R"([{"type": "word", "value": "<tool_call>"}])"));
    CHECK(chat_tools_grammar(tools_for(ToolFormat::Hermes, "required"), *tok).triggers.empty());
    auto single = grammar(tools_for(ToolFormat::Hermes, "required", false));
    CHECK(grammar_accepts(*single, block(add)));
    CHECK_FALSE(grammar_accepts(*single, block(add) + "\n" + block(add)));

    // Llama 3: the reply is one object with "parameters".
    auto llama = grammar(tools_for(ToolFormat::Llama3));
    CHECK(grammar_accepts(*llama, R"({"name": "add", "parameters": {"a": 2, "b": 3}})"));
    CHECK_FALSE(grammar_accepts(*llama, add));
    CHECK_FALSE(grammar_accepts(*llama, R"({"name": "rm", "parameters": {}})"));
    const ToolGrammar llama_auto = chat_tools_grammar(tools_for(ToolFormat::Llama3), *tok);
    REQUIRE(llama_auto.triggers.size() == 1);  // (no <|python_tag|> in this vocabulary)
    CHECK(llama_auto.triggers[0]["type"] == "pattern_full");

    // Mistral Nemo: a list, each call with an optional short id; the vocabulary has no
    // [TOOL_CALLS] token, so "auto" waits for its text.
    auto mistral = grammar(tools_for(ToolFormat::MistralNemo));
    CHECK(grammar_accepts(*mistral, "[" + add + "]"));
    CHECK(grammar_accepts(
        *mistral,
        R"([{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "x1y2z3w4v"}, )" + weather + "]"));
    CHECK_FALSE(grammar_accepts(*mistral, add));
    CHECK_FALSE(grammar_accepts(*mistral, "[" + not_listed + "]"));
    const ToolGrammar mistral_auto = chat_tools_grammar(tools_for(ToolFormat::MistralNemo), *tok);
    CHECK(mistral_auto.triggers[0]["type"] == "pattern");
    CHECK(chat_tools_prompt_suffix(tools_for(ToolFormat::MistralNemo, "required")) ==
          "[TOOL_CALLS]");
    CHECK(chat_tools_prompt_suffix(tools_for(ToolFormat::MistralNemo)).empty());
    CHECK(chat_tools_prompt_suffix(tools_for(ToolFormat::Hermes, "required")).empty());

    // Mistral v11: [TOOL_CALLS]name[ARGS]{...} per call (here the tags are text: the vocabulary
    // has no such tokens); "auto" starts after the first tag, a required call writes it.
    auto v11 = grammar(tools_for(ToolFormat::MistralV11, "required"));
    const std::string v11_add = R"([TOOL_CALLS]add[ARGS]{"a": 2, "b": 3})";
    const std::string v11_weather =
        R"([TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "unit": "celsius"})";
    CHECK(grammar_accepts(*v11, v11_add));
    CHECK(grammar_accepts(*v11, v11_add + v11_weather + v11_add));
    CHECK_FALSE(grammar_accepts(*v11, R"([TOOL_CALLS]rm[ARGS]{})"));
    CHECK_FALSE(grammar_accepts(*v11, R"([TOOL_CALLS]add[ARGS]{"a": "two", "b": 3})"));
    CHECK_FALSE(grammar_accepts(*v11, R"([TOOL_CALLS]get_weather[ARGS]{"a": 2, "b": 3})"));
    CHECK_FALSE(grammar_accepts(*v11, R"(add[ARGS]{"a": 2, "b": 3})"));
    auto v11_single = grammar(tools_for(ToolFormat::MistralV11, "required", false));
    CHECK(grammar_accepts(*v11_single, v11_add));
    CHECK_FALSE(grammar_accepts(*v11_single, v11_add + v11_add));
    const ToolGrammar v11_auto = chat_tools_grammar(tools_for(ToolFormat::MistralV11), *tok);
    CHECK(v11_auto.triggers ==
          json::parse(R"j([{"type": "pattern", "value": "\\[TOOL_CALLS\\]()"}])j"));
    CHECK(v11_auto.preserved.empty());  // (no control tokens to show)
    CHECK(grammar_accepts(*Grammar::parse(v11_auto.gbnf), v11_add.substr(12) + v11_weather));
    CHECK(chat_tools_prompt_suffix(tools_for(ToolFormat::MistralV11, "required")).empty());
    // Tools whose parameters share $defs: each tool's own rule, the definitions once.
    ojson defs_req = {{"tools", ojson::parse(R"([
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object",
          "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"enum": ["x", "y"]}}}}},
        {"type": "function", "function": {"name": "b", "parameters": {"type": "object",
          "properties": {"q": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"enum": ["x", "y"]}}}}}])")},
                      {"tool_choice", "required"}};
    ChatTools defs_tools = *chat_tools_from_json(defs_req);
    defs_tools.format = ToolFormat::MistralV11;
    auto v11_defs = grammar(defs_tools);
    CHECK(grammar_accepts(*v11_defs,
                          R"([TOOL_CALLS]a[ARGS]{"p": "x"}[TOOL_CALLS]b[ARGS]{"q": "y"})"));
    CHECK_FALSE(grammar_accepts(*v11_defs, R"([TOOL_CALLS]a[ARGS]{"q": "x"})"));
    CHECK_FALSE(grammar_accepts(*v11_defs, R"([TOOL_CALLS]b[ARGS]{"q": "z"})"));

    // Qwen3-Coder: parameters in XML, strings raw (bounded by maxLength here), enums as their
    // words, integers as JSON within their bounds; the required ones always.
    auto coder = grammar(tools_for(ToolFormat::Qwen3Coder, "required"));
    auto xml = [](const std::string& fn, const std::string& params) {
        return "<tool_call>\n<function=" + fn + ">\n" + params + "</function>\n</tool_call>";
    };
    auto param = [](const std::string& name, const std::string& value) {
        return "<parameter=" + name + ">\n" + value + "\n</parameter>\n";
    };
    const std::string coder_add = xml("add", param("a", "2") + param("b", "3"));
    const std::string coder_weather =
        xml("get_weather", param("city", "New York") + param("unit", "celsius"));
    CHECK(grammar_accepts(*coder, coder_add));
    CHECK(grammar_accepts(*coder, coder_weather + "\n" + coder_add));
    CHECK_FALSE(grammar_accepts(*coder, xml("add", param("a", "2"))));  // b is required
    CHECK_FALSE(grammar_accepts(*coder, xml("add", param("a", "two") + param("b", "3"))));
    CHECK_FALSE(grammar_accepts(*coder, xml("add", param("a", "1000") + param("b", "3"))));
    CHECK_FALSE(grammar_accepts(
        *coder, xml("get_weather", param("city", "\"Oslo\"") + param("unit", "kelvin"))));
    CHECK_FALSE(grammar_accepts(*coder, xml("get_weather", param("city", "Llanfairpwllgwyngyll") +
                                                               param("unit", "celsius"))));
    CHECK_FALSE(grammar_accepts(*coder, xml("rm", "")));
    CHECK(chat_tools_grammar(tools_for(ToolFormat::Qwen3Coder), *tok).triggers ==
          json::parse(R"([{"type": "word", "value": "<tool_call>"}])"));
    // Unbounded strings: any text that does not close the parameter; optional parameters.
    ojson free_req = {{"tools", ojson::parse(R"([{"type": "function", "function": {"name": "note",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"},
          "tags": {"type": "array", "items": {"type": "string"}}, "pinned": {"type": "boolean"}},
          "required": ["text"]}}}])")},
                      {"tool_choice", "required"}};
    ChatTools free_tools = *chat_tools_from_json(free_req);
    free_tools.format = ToolFormat::Qwen3Coder;
    auto coder_free = grammar(free_tools);
    CHECK(grammar_accepts(*coder_free, xml("note", param("text", "a <b>\n</parameter no\nmore"))));
    CHECK(grammar_accepts(*coder_free,
                          xml("note", param("text", "x") + param("tags", R"(["a", "b"])") +
                                          param("pinned", "true"))));
    CHECK(grammar_accepts(*coder_free, xml("note", param("text", "x") + param("pinned", "false"))));
    CHECK_FALSE(grammar_accepts(*coder_free, xml("note", param("text", "a\n</parameter>\nb"))));
    CHECK_FALSE(grammar_accepts(*coder_free, xml("note", param("text", "x") + param("tags", "a"))));

    // DeepSeek R1: its tags (text in this vocabulary), each call a name and a JSON block;
    // after reasoning the prompt opened when a call is required.
    const std::string r1_add =
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": "
        "2, \"b\": 3}\n```<｜tool▁call▁end｜>";
    const std::string r1_weather =
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```"
        "json\n{\"city\": \"Oslo\", \"unit\": \"celsius\"}\n```<"
        "｜tool▁call▁end｜>";
    const std::string r1_begin = "<｜tool▁calls▁begin｜>", r1_end = "<｜tool▁calls▁end｜>";
    auto r1_required = grammar(tools_for(ToolFormat::DeepSeekR1, "required"));
    CHECK(grammar_accepts(*r1_required, r1_begin + r1_add + r1_end));
    CHECK(grammar_accepts(*r1_required, r1_begin + r1_weather + "\n" + r1_add + r1_end));
    CHECK_FALSE(grammar_accepts(*r1_required, r1_add + r1_end));
    CHECK_FALSE(grammar_accepts(*r1_required, r1_begin + r1_add));
    CHECK_FALSE(grammar_accepts(*r1_required,
                                r1_begin +
                                    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{"
                                    "\"a\": \"x\", \"b\": 3}\n```<｜tool▁call▁end｜>" +
                                    r1_end));
    const ToolGrammar r1_auto = chat_tools_grammar(tools_for(ToolFormat::DeepSeekR1), *tok);
    CHECK(r1_auto.triggers[0]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(r1_auto.gbnf), r1_add + r1_add + r1_end));
    auto r1_open = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::DeepSeekR1, "required"), *tok, ToolThinking::Open)
            .gbnf);
    CHECK(grammar_accepts(*r1_open, "Sum them.</think>\n\n" + r1_begin + r1_add + r1_end));
    CHECK_FALSE(grammar_accepts(*r1_open, r1_begin + r1_add + r1_end));

    // A tool without parameters (and names that need escaping) in every native syntax: the
    // grammar builds and admits a call with no arguments.
    {
        ojson req = {{"tools", ojson::parse(R"([{"type": "function", "function": {
            "name": "now\"ish"}}])")},
                     {"tool_choice", "required"}};
        ChatTools bare = *chat_tools_from_json(req);
        const std::pair<ToolFormat, std::string> calls[] = {
            {ToolFormat::Hermes,
             "<tool_call>\n{\"name\": \"now\\\"ish\", \"arguments\": {}}\n</tool_call>"},
            {ToolFormat::Llama3, "{\"name\": \"now\\\"ish\", \"parameters\": {}}"},
            {ToolFormat::MistralV11, "[TOOL_CALLS]now\"ish[ARGS]{}"},
            {ToolFormat::Qwen3Coder, "<tool_call>\n<function=now\"ish>\n</function>\n</tool_call>"},
            {ToolFormat::DeepSeekR1,
             "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
             "now\"ish\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
        };
        for (const auto& [format, text] : calls) {
            CAPTURE(tool_format_name(format));
            bare.format = format;
            auto g = Grammar::parse(chat_tools_grammar(bare, *tok).gbnf);
            CHECK(grammar_accepts(*g, text));
            const ChatToolReply back = chat_tools_parse(format, text, "c", &bare);
            REQUIRE(back.calls.size() == 1);
            CHECK(back.calls[0].name == "now\"ish");
            CHECK(back.calls[0].arguments == "{}");
        }
    }

    // The embedded schema's rules keep clear of the caller's names.
    const ojson schema = ojson::parse(R"({"type": "object", "properties": {
        "tool-block": {"type": "integer"}, "root": {"type": "string"}}})");
    const std::string rules = json_schema_to_grammar_rule(schema, "tool-call", {"tool-block"});
    CHECK(rules.find("\ntool-block ::=") == std::string::npos);
    CHECK(rules.find("root ::=") == std::string::npos);
    CHECK(grammar_accepts(*Grammar::parse(rules + "root ::= \"<\" tool-call \">\"\n"),
                          R"(<{"tool-block": 1, "root": "x"}>)"));
    CHECK_THROWS_AS(json_schema_to_grammar_rule(schema, "root"), Error);
    CHECK_THROWS_AS(json_schema_to_grammar_rule(schema, "ws"), Error);

    // A required call after reasoning: the block first (optional, or already opened by the
    // prompt), never closed twice, then the calls.
    auto thinking = [&](ToolFormat f, ToolThinking th) {
        return Grammar::parse(chat_tools_grammar(tools_for(f, "required"), *tok, th).gbnf);
    };
    auto optional = thinking(ToolFormat::Hermes, ToolThinking::Optional);
    CHECK(grammar_accepts(*optional, block(add)));
    CHECK(grammar_accepts(*optional, "<think>Add 2 and 3 </thi </think>\n\n" + block(add)));
    CHECK(grammar_accepts(*optional, "<think></think>" + block(add)));
    CHECK_FALSE(grammar_accepts(*optional, "<think>a</think> b </think>\n" + block(add)));
    CHECK_FALSE(grammar_accepts(*optional, "<think>never closed " + block(add)));
    CHECK_FALSE(grammar_accepts(*optional, "Sure! " + block(add)));
    auto open = thinking(ToolFormat::Hermes, ToolThinking::Open);
    CHECK(grammar_accepts(*open, "The user wants a sum.\n</think>\n\n" + block(add)));
    CHECK(grammar_accepts(*open, "<<//</think>" + block(add)));
    CHECK_FALSE(grammar_accepts(*open, block(add)));  // the block must close first
    auto llama_open = thinking(ToolFormat::Llama3, ToolThinking::Open);
    CHECK(grammar_accepts(*llama_open,
                          R"(sum</think> {"name": "add", "parameters": {"a": 2, "b": 3}})"));
    // Without a required call the grammar is lazy and leaves the reasoning free.
    CHECK(chat_tools_grammar(tools_for(ToolFormat::Hermes), *tok, ToolThinking::Open).gbnf ==
          chat_tools_grammar(tools_for(ToolFormat::Hermes), *tok).gbnf);

    // A named tool: only it.
    ChatTools t = tools_for(ToolFormat::Hermes);
    t.only = "add";
    t.required = true;
    auto g_add = grammar(t);
    CHECK(grammar_accepts(*g_add, block(add)));
    CHECK_FALSE(grammar_accepts(*g_add, block(weather)));
}

TEST_CASE("tool formats: gpt-oss's harmony calls, grammar and read back") {
    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    // Required: the reasoning may come first, then a commentary message to a listed function
    // with arguments its schema admits; the recipient may sit in the role's part instead.
    const ToolGrammar req = chat_tools_grammar(tools_for(ToolFormat::Harmony, "required"), *tok);
    CHECK(req.triggers.empty());
    auto g = Grammar::parse(req.gbnf);
    auto admits = [&](const std::string& text) { return grammar_accepts(*g, text); };
    CHECK(
        admits("<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
               R"({"a": 1, "b": 2})"));
    CHECK(admits(
        "<|channel|>analysis<|message|>Sum <them>.<|end|><|start|>assistant"
        R"(<|channel|>commentary to=functions.get_weather<|message|>{"city": "Oslo", "unit": "celsius"})"));
    CHECK(admits(R"( to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2})"));
    CHECK_FALSE(admits(R"(<|channel|>commentary to=functions.mul<|message|>{"a": 1, "b": 2})"));
    CHECK_FALSE(admits(R"(<|channel|>commentary to=functions.add<|message|>{"a": "x"})"));
    CHECK_FALSE(admits("<|channel|>final<|message|>No call."));
    // Auto: the grammar from the recipient on, after either trigger.
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::Harmony), *tok);
    CHECK(lazy.triggers.size() == 2);
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf),
                          R"(functions.add <|constrain|>json<|message|>{"a": 1, "b": 2})"));
    // Read back: the call from its message, the final text as content, ids as asked.
    const ChatToolReply r = chat_tools_parse(
        ToolFormat::Harmony,
        "<|channel|>analysis<|message|>Use add.<|end|><|start|>assistant<|channel|>commentary "
        R"(to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3})",
        "call_x");
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[0].id == "call_x_0");
    CHECK(r.content.empty());
    const ChatToolReply answer = chat_tools_parse(
        ToolFormat::Harmony,
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>5",
        "c");
    CHECK(answer.calls.empty());
    CHECK(answer.content == "5");
    CHECK(chat_tools_parse(ToolFormat::Harmony, "not harmony", "c").content == "not harmony");
    const ToolAnswerPrefix p =
        tool_stream_content(ToolFormat::Harmony,
                            "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>"
                            "final<|message|>The ans");
    CHECK(p.answer);
    CHECK(p.text == "The ans");
}

TEST_CASE("tool formats: Phi-4-mini's <|tool_call|> list and its tools in the system message") {
    const std::string path = model_path();
    if (path.empty()) return;
    CHECK(tool_format_detect(kPhi4Mini) == ToolFormat::Phi4Mini);
    CHECK(std::string(tool_format_name(ToolFormat::Phi4Mini)) == "phi-4-mini");
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    const std::string add = R"({"name": "add", "arguments": {"a": 2, "b": 3}})";
    const std::string weather =
        R"({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}})";
    const std::string open = "<|tool_call|>[", close = "]<|/tool_call|>";
    auto required =
        Grammar::parse(chat_tools_grammar(tools_for(ToolFormat::Phi4Mini, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, open + add + close));
    CHECK(grammar_accepts(*required, open + add + ", " + weather + close));
    CHECK_FALSE(grammar_accepts(*required, open + add + "]"));   // closed by its tag
    CHECK_FALSE(grammar_accepts(*required, "[" + add + close));  // the tag first
    CHECK_FALSE(grammar_accepts(*required, open + R"({"name": "rm", "arguments": {}})" + close));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::Phi4Mini, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, open + add + ", " + add + close));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::Phi4Mini), *tok);
    REQUIRE(lazy.triggers.size() == 1);  // (this vocabulary has no such token: its text)
    CHECK(lazy.triggers[0]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf), "[" + add + close));

    // Read back: text before the tag is content; several blocks; the end tag may be missing.
    const ChatToolReply r = chat_tools_parse(
        ToolFormat::Phi4Mini,
        "Let me add.<|tool_call|>[" + add + close + "\n" + open + weather + "]", "c");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[1].name == "get_weather");
    CHECK(r.calls[1].id == "c_1");
    CHECK(r.content == "Let me add.");
    CHECK(chat_tools_parse(ToolFormat::Phi4Mini, "<|tool_call|>oops", "c").content ==
          "<|tool_call|>oops");
    CHECK(chat_tools_parse(ToolFormat::Phi4Mini, "No tools needed.", "c").content ==
          "No tools needed.");
    CHECK(tool_stream_content(ToolFormat::Phi4Mini, "Sure <|tool_").text == "Sure");

    // Rendered as jinja2 3.1.6 renders the template (trim_blocks, lstrip_blocks) on the
    // messages the server makes: the functions as JSON text in the system message's "tools",
    // the earlier call in the assistant's content, as Python writes JSON.
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
        "description": "Adds.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}])");
    const JinjaTemplate t = JinjaTemplate::parse(kPhi4Mini);
    const std::string fn =
        R"([{"name": "add", "description": "Adds.", "parameters": {"type": "object", )"
        R"("properties": {"a": {"type": "integer"}}}}])";
    CHECK(chat_tools_render(t, ToolFormat::Phi4Mini, chat_messages_native(ojson::parse(kHistory)),
                            tools, {}) ==
          "<|system|>Be brief.<|tool|>" + fn +
              "<|/tool|><|end|><|user|>2+3?<|end|><|assistant|><|tool_call|>[{\"name\": \"add\", "
              "\"arguments\": {\"a\": 2, \"b\": 3}}]<|/tool_call|><|end|><|tool|>5<|end|><|user|>"
              "And 4+4?<|end|><|assistant|>");
    // Without a system message, one saying the model has tools (Microsoft's examples).
    CHECK(chat_tools_render(
              t, ToolFormat::Phi4Mini,
              chat_messages_native(ojson::parse(R"([{"role": "user", "content": "2+3?"}])")), tools,
              {}) == "<|system|>You are a helpful assistant with some tools.<|tool|>" + fn +
                         "<|/tool|><|end|><|user|>2+3?<|end|><|assistant|>");
}

TEST_CASE("tool formats: Functionary v3.1's <function=NAME> calls and python tag") {
    const std::string path = model_path();
    if (path.empty()) return;
    // Llama 3.1's headers and ipython turns, but its own call syntax: not Llama3's.
    CHECK(tool_format_detect(kFunctionaryV31) == ToolFormat::FunctionaryV31);
    CHECK(tool_format_detect(kLlama3) == ToolFormat::Llama3);
    CHECK(std::string(tool_format_name(ToolFormat::FunctionaryV31)) == "functionary-v3.1");
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    const std::string add = R"(<function=add>{"a": 2, "b": 3}</function>)";
    const std::string weather =
        R"(<function=get_weather>{"city": "Oslo", "unit": "celsius"}</function>)";
    auto required = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::FunctionaryV31, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, add));
    CHECK(grammar_accepts(*required, add + "\n" + weather));
    CHECK_FALSE(grammar_accepts(*required, R"(<function=add>{"a": 2, "b": 3})"));  // closed
    CHECK_FALSE(grammar_accepts(*required, R"(<function=rm>{}</function>)"));
    CHECK_FALSE(grammar_accepts(*required, R"(<function=add>{"city": "Oslo"}</function>)"));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::FunctionaryV31, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, add + add));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::FunctionaryV31), *tok);
    REQUIRE(lazy.triggers.size() == 1);  // (no "python" tool listed)
    CHECK(lazy.triggers[0] == json({{"type", "word"}, {"value", "<function="}}));
    // A listed "python" tool: its code after <|python_tag|>.
    ojson with_python = {{"tools", weather_and_add()}, {"tool_choice", "required"}};
    with_python["tools"].push_back(ojson::parse(R"({"type": "function", "function": {
        "name": "python", "parameters": {"type": "object",
        "properties": {"code": {"type": "string"}}, "required": ["code"]}}})"));
    ChatTools python_tools = *chat_tools_from_json(with_python);
    python_tools.format = ToolFormat::FunctionaryV31;
    auto python = Grammar::parse(chat_tools_grammar(python_tools, *tok).gbnf);
    CHECK(grammar_accepts(*python, "<|python_tag|>print(2 + 3)"));
    CHECK(grammar_accepts(*python, add));

    // Read back: text before the calls is content; several calls; the python tag's code.
    const ChatToolReply r =
        chat_tools_parse(ToolFormat::FunctionaryV31, "Adding.\n" + add + weather, "c");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[1].name == "get_weather");
    CHECK(r.content == "Adding.");
    const ChatToolReply code =
        chat_tools_parse(ToolFormat::FunctionaryV31, "<|python_tag|>print(2 + 3)\n", "c");
    REQUIRE(code.calls.size() == 1);
    CHECK(code.calls[0].name == "python");
    CHECK(code.calls[0].arguments == R"x({"code":"print(2 + 3)"})x");
    CHECK(chat_tools_parse(ToolFormat::FunctionaryV31, "<function=add>oops", "c").content ==
          "<function=add>oops");
    CHECK(tool_stream_content(ToolFormat::FunctionaryV31, "Sure <funct").text == "Sure");
    CHECK(tool_stream_content(ToolFormat::FunctionaryV31, "Sure <|python_").text == "Sure");

    // Rendered as jinja2 3.1.6 renders it: the call's arguments added as text (objects fail
    // there, so the server's retry with OpenAI's JSON text is what renders).
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
        "description": "Adds.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}])");
    CHECK(chat_tools_render(JinjaTemplate::parse(kFunctionaryV31), ToolFormat::FunctionaryV31,
                            chat_messages_native(ojson::parse(kHistory)), tools, {}) ==
          "<|start_header_id|>system<|end_header_id|>\n\nFunctions:\n{\"name\": \"add\", "
          "\"description\": \"Adds.\", \"parameters\": {\"type\": \"object\", \"properties\": "
          "{\"a\": {\"type\": \"integer\"}}}}\nCall one as <function=NAME>{\"ARG\": "
          "VALUE}</function>.\n<|eot_id|><|start_header_id|>system<|end_header_id|>\n\nBe "
          "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+3?<|eot_id|><|start_"
          "header_id|>assistant<|end_header_id|>\n\n<function=add>{\"a\":2,\"b\":3}</"
          "function><|eom_id|><|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|><|start_"
          "header_id|>user<|end_header_id|>\n\nAnd 4+4?<|eot_id|><|start_header_id|>assistant<|"
          "end_header_id|>\n\n");
}

TEST_CASE("tool formats: FireFunction v2's functools[...] list and its template variables") {
    const std::string path = model_path();
    if (path.empty()) return;
    CHECK(tool_format_detect(kFireFunctionV2) == ToolFormat::FireFunctionV2);
    CHECK(std::string(tool_format_name(ToolFormat::FireFunctionV2)) == "firefunction-v2");
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    const std::string add = R"({"name": "add", "arguments": {"a": 2, "b": 3}})";
    const std::string weather =
        R"({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}})";
    auto required = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::FireFunctionV2, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, " functools[" + add + "]"));  // (the template's space)
    CHECK(grammar_accepts(*required, "functools[" + add + ", " + weather + "]"));
    CHECK_FALSE(grammar_accepts(*required, "[" + add + "]"));
    CHECK_FALSE(grammar_accepts(*required, R"(functools[{"name": "rm", "arguments": {}}])"));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::FireFunctionV2, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, "functools[" + add + ", " + add + "]"));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::FireFunctionV2), *tok);
    REQUIRE(lazy.triggers.size() == 1);
    CHECK(lazy.triggers[0] == json({{"type", "word"}, {"value", "functools["}}));
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf), "functools[" + add + "]"));
    // Read back.
    const ChatToolReply r = chat_tools_parse(
        ToolFormat::FireFunctionV2, "Adding. functools[" + add + ", " + weather + "]", "c");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[1].name == "get_weather");
    CHECK(r.content == "Adding.");
    CHECK(chat_tools_parse(ToolFormat::FireFunctionV2, "functools[oops", "c").content ==
          "functools[oops");
    CHECK(tool_stream_content(ToolFormat::FireFunctionV2, "Sure functo").text == "Sure");

    // Rendered as jinja2 3.1.6 renders it with the variables the server gives: "functions"
    // (the tools as Python's json.dumps(indent=2) writes them) and "datetime" (here given as a
    // kwarg; by default the time now, "%b %d %Y %H:%M:%S GMT").
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
        "description": "Adds.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}])");
    const JinjaTemplate t = JinjaTemplate::parse(kFireFunctionV2);
    const ojson msgs = chat_messages_native(ojson::parse(kHistory));
    CHECK(chat_tools_render(t, ToolFormat::FireFunctionV2, msgs, tools, {},
                            {{"datetime", "Jan 01 2026 00:00:00 GMT"}}) ==
          "<|start_header_id|>system<|end_header_id|>\n\nBe brief.\nCall functions as "
          "functools[{\"name\": NAME, \"arguments\": ARGS}, ...].\nFunctions:\n[\n  {\n    "
          "\"type\": \"function\",\n    \"function\": {\n      \"name\": \"add\",\n      "
          "\"description\": \"Adds.\",\n      \"parameters\": {\n        \"type\": "
          "\"object\",\n        \"properties\": {\n          \"a\": {\n            \"type\": "
          "\"integer\"\n          }\n        }\n      }\n    }\n  }\n]\nToday is Jan 01 2026 "
          "00:00:00 GMT.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+3?<|eot_id|><|"
          "start_header_id|>assistant<|end_header_id|>\n\n functools[{\"name\": \"add\", "
          "\"arguments\": {\"a\":2,\"b\":3}}]<|eot_id|><|start_header_id|>tool<|end_header_id|>"
          "\n\n5<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 4+4?<|eot_id|><|start_"
          "header_id|>assistant<|end_header_id|>\n\n");
    const std::string now = chat_tools_render(t, ToolFormat::FireFunctionV2, msgs, tools, {});
    CHECK(now.find(" GMT.<|eot_id|>") != std::string::npos);
    // A chat without tools renders too (functions "", as llama.cpp gives them).
    const std::string plain = chat_template_apply_jinja(
        t, ojson::parse(R"([{"role": "user", "content": "Hi"}])"), nullptr, true, {});
    CHECK(plain.find("Functions:\n\nToday is ") != std::string::npos);
}

TEST_CASE("tool formats: Functionary v3.2's >>>NAME parts") {
    const std::string path = model_path();
    if (path.empty()) return;
    // Llama 3's headers, but ">>>all": neither Llama3 nor v3.1.
    CHECK(tool_format_detect(kFunctionaryV32) == ToolFormat::FunctionaryV32);
    CHECK(tool_format_detect(kFunctionaryV31) == ToolFormat::FunctionaryV31);
    CHECK(std::string(tool_format_name(ToolFormat::FunctionaryV32)) == "functionary-v3.2");
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    const std::string add = "add\n{\"a\": 2, \"b\": 3}";
    const std::string weather = "get_weather\n{\"city\": \"Oslo\", \"unit\": \"celsius\"}";
    // Required: the first call right after the prompt's ">>>" (or after one of its own), the
    // others each after ">>>".
    auto required = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::FunctionaryV32, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, add));
    CHECK(grammar_accepts(*required, ">>>" + add));
    CHECK(grammar_accepts(*required, add + ">>>" + weather));
    CHECK_FALSE(grammar_accepts(*required, add + weather));
    CHECK_FALSE(grammar_accepts(*required, "all\nHello"));
    CHECK_FALSE(grammar_accepts(*required, "rm\n{}"));
    CHECK_FALSE(grammar_accepts(*required, "add\n{\"city\": \"Oslo\"}"));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::FunctionaryV32, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, add + ">>>" + add));
    // Auto: a reply that starts with a tool's name, or ">>>" and a name after the text.
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::FunctionaryV32), *tok);
    REQUIRE(lazy.triggers.size() == 3);
    CHECK(lazy.triggers[0] ==
          json({{"type", "pattern_full"}, {"value", "((?:get_weather|add)\\n[\\s\\S]*)"}}));
    CHECK(lazy.triggers[1] == json({{"type", "word"}, {"value", ">>>get_weather"}}));
    CHECK(lazy.triggers[2] == json({{"type", "word"}, {"value", ">>>add"}}));
    // A listed "python" tool: its code after "python\n".
    ojson with_python = {{"tools", weather_and_add()}, {"tool_choice", "required"}};
    with_python["tools"].push_back(ojson::parse(R"({"type": "function", "function": {
        "name": "python", "parameters": {"type": "object",
        "properties": {"code": {"type": "string"}}, "required": ["code"]}}})"));
    ChatTools python_tools = *chat_tools_from_json(with_python);
    python_tools.format = ToolFormat::FunctionaryV32;
    auto python = Grammar::parse(chat_tools_grammar(python_tools, *tok).gbnf);
    CHECK(grammar_accepts(*python, "python\nprint(2 + 3)"));
    CHECK(grammar_accepts(*python, add));

    // Read back: the "all" part is the content; several calls; python's code.
    const ChatToolReply r = chat_tools_parse(ToolFormat::FunctionaryV32,
                                             "all\nAdding.\n>>>" + add + ">>>" + weather, "c");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[1].name == "get_weather");
    CHECK(r.content == "Adding.");
    const ChatToolReply first = chat_tools_parse(ToolFormat::FunctionaryV32, add, "c");
    REQUIRE(first.calls.size() == 1);
    CHECK(first.content.empty());
    const ChatToolReply text =
        chat_tools_parse(ToolFormat::FunctionaryV32, "all\nPrompt: >>> is Python's.", "c");
    CHECK(text.calls.empty());
    CHECK(text.content == "Prompt: >>> is Python's.");
    const ChatToolReply code =
        chat_tools_parse(ToolFormat::FunctionaryV32, "python\nprint(2 + 3)\n", "c");
    REQUIRE(code.calls.size() == 1);
    CHECK(code.calls[0].name == "python");
    CHECK(code.calls[0].arguments == R"x({"code":"print(2 + 3)"})x");
    for (const char* raw : {"Hello there", "add\noops", "all"})
        CHECK(chat_tools_parse(ToolFormat::FunctionaryV32, raw, "c").content == raw);
    // Streamed: the "all" part's text, never the name of a part.
    CHECK(tool_stream_content(ToolFormat::FunctionaryV32, "all\nSure >>").text == "Sure");
    CHECK(tool_stream_content(ToolFormat::FunctionaryV32, "all\nSure\n>>>add\n{").text == "Sure");
    CHECK_FALSE(tool_stream_content(ToolFormat::FunctionaryV32, "al").decided);
    CHECK(tool_stream_content(ToolFormat::FunctionaryV32, "add\n{").text.empty());
    CHECK(tool_stream_content(ToolFormat::FunctionaryV32, "add\n{").decided);

    // Rendered as jinja2 3.1.6 renders it (the call's arguments added as text).
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
        "description": "Adds.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}])");
    CHECK(
        chat_tools_render(JinjaTemplate::parse(kFunctionaryV32), ToolFormat::FunctionaryV32,
                          chat_messages_native(ojson::parse(kHistory)), tools, {}) ==
        "<|start_header_id|>system<|end_header_id|>\n\n// Supported function definitions that "
        "should be called when necessary.\nnamespace functions {\n// Adds.\ntype add = (_: "
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}) => "
        "any;\n} // namespace functions<|eot_id|><|start_header_id|>system<|end_header_id|>\n\nBe "
        "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+3?<|eot_id|><|start_"
        "header_id|>assistant<|end_header_id|>\n\n>>>add\n{\"a\":2,\"b\":3}<|eot_id|><|"
        "start_header_id|>tool<|end_header_id|>\n\n5<|eot_id|><|start_header_id|>user<|end_"
        "header_id|>\n\nAnd 4+4?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n>>>");
}

TEST_CASE("tool formats: Granite's <|tool_call|> list") {
    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    const std::string add = R"({"name": "add", "arguments": {"a": 2, "b": 3}})";
    const std::string weather =
        R"({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}})";
    auto required =
        Grammar::parse(chat_tools_grammar(tools_for(ToolFormat::Granite, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, "<|tool_call|>[" + add + "]"));
    CHECK(grammar_accepts(*required, "<|tool_call|>[" + add + ", " + weather + "]"));
    CHECK_FALSE(grammar_accepts(*required, "[" + add + "]"));  // the tag first
    CHECK_FALSE(grammar_accepts(*required, R"(<|tool_call|>[{"name": "rm", "arguments": {}}])"));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::Granite, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, "<|tool_call|>[" + add + ", " + add + "]"));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::Granite), *tok);
    REQUIRE(lazy.triggers.size() == 1);  // (this vocabulary has no such token: its text)
    CHECK(lazy.triggers[0]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf), "[" + add + "]"));
    // Read back: text before the tag is content; a reply without a list is all content.
    const ChatToolReply r =
        chat_tools_parse(ToolFormat::Granite, "Let me add.<|tool_call|>[" + add + "]", "c");
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.content == "Let me add.");
    CHECK(chat_tools_parse(ToolFormat::Granite, "<|tool_call|>oops", "c").content ==
          "<|tool_call|>oops");
    CHECK(tool_stream_content(ToolFormat::Granite, "Sure <|tool_").text == "Sure");
    // Earlier calls go into the assistant's content, as the model wrote them.
    const ojson msgs = chat_messages_for_format(
        ToolFormat::Granite,
        chat_messages_native(ojson::parse(R"([{"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "x", "type": "function",
             "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]}])")));
    CHECK(msgs[1]["content"] == R"(<|tool_call|>[{"name":"add","arguments":{"a":2,"b":3}}])");
}

TEST_CASE("tool formats: replies read back; streams show only content the reply keeps") {
    // Hermes: text before the calls is content; several calls; an unclosed last block.
    ChatToolReply r = chat_tools_parse(ToolFormat::Hermes,
                                       "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", "
                                       "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
                                       "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
                                       "call_7");
    CHECK(r.content == "Let me look.");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(r.calls[0].arguments == R"({"city":"Oslo"})");
    CHECK(r.calls[0].id == "call_7_0");
    CHECK(r.calls[1].arguments == R"({"a":1})");
    // Cut short by max_tokens after the object: the call is whole.
    r = chat_tools_parse(
        ToolFormat::Hermes,
        "<tool_call>\n{ \"name\" : \"add\" , \"arguments\" : {\"s\": \"}{\\\"\"} }\n</tool_c", "c");
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].arguments == R"({"s":"}{\""})");
    CHECK(r.content.empty());
    r = chat_tools_parse(ToolFormat::Hermes, "Just words.", "c");
    CHECK(r.calls.empty());
    CHECK(r.content == "Just words.");
    r = chat_tools_parse(ToolFormat::Hermes, "<tool_call>{broken</tool_call>", "c");
    CHECK(r.calls.empty());  // nothing readable: all of it is content
    CHECK(r.content == "<tool_call>{broken</tool_call>");

    // Llama 3: the whole reply, "parameters" (or "arguments"), an optional python tag.
    r = chat_tools_parse(ToolFormat::Llama3, R"( {"name": "add", "parameters": {"a": 1, "b": 2}} )",
                         "c");
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].arguments == R"({"a":1,"b":2})");
    CHECK(chat_tools_parse(ToolFormat::Llama3, R"(<|python_tag|>{"name": "add", "arguments": {}})",
                           "c")
              .calls.size() == 1);
    CHECK(chat_tools_parse(ToolFormat::Llama3, "It is 5.", "c").content == "It is 5.");

    // Mistral Nemo: the list (after [TOOL_CALLS] when shown), ids of 9 letters and digits.
    r = chat_tools_parse(
        ToolFormat::MistralNemo,
        R"([{"name": "add", "arguments": {"a": 1}, "id": "zzz"}, {"name": "add", "arguments": {"a": 2}}])",
        "call_chatcmpl-3_0");
    REQUIRE(r.calls.size() == 2);
    std::set<std::string> ids;
    for (const ToolCall& c : r.calls) {
        CHECK(c.id.size() == 9);
        CHECK(std::all_of(c.id.begin(), c.id.end(),
                          [](char ch) { return std::isalnum(uint8_t(ch)); }));
        ids.insert(c.id);
    }
    CHECK(ids.size() == 2);
    CHECK(chat_tools_parse(ToolFormat::MistralNemo,
                           R"([TOOL_CALLS][{"name": "add", "arguments": {}}])", "c")
              .calls.size() == 1);
    CHECK(chat_tools_parse(ToolFormat::MistralNemo, "[1] is a footnote.", "c").content ==
          "[1] is a footnote.");

    // Mistral v11: text before the calls is content; each [TOOL_CALLS]name[ARGS]{...}; an id
    // the model writes ([CALL_ID]) is replaced by ours; nothing readable is all content.
    r = chat_tools_parse(ToolFormat::MistralV11,
                         "Checking. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}"
                         "[TOOL_CALLS] add[CALL_ID]x1[ARGS] {\"a\": 1, \"s\": \"[ARGS]}\"}",
                         "call_9");
    CHECK(r.content == "Checking.");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(r.calls[0].arguments == R"({"city":"Oslo"})");
    CHECK(r.calls[1].name == "add");
    CHECK(r.calls[1].arguments == R"({"a":1,"s":"[ARGS]}"})");
    CHECK(r.calls[0].id.size() == 9);
    CHECK(r.calls[0].id != r.calls[1].id);
    CHECK(chat_tools_parse(ToolFormat::MistralV11, "[TOOL_CALLS]add[ARGS]{broken", "c").content ==
          "[TOOL_CALLS]add[ARGS]{broken");
    CHECK(chat_tools_parse(ToolFormat::MistralV11, "It is 5.", "c").content == "It is 5.");

    // Qwen3-Coder: values of string parameters stay text ("5" too), others are JSON where
    // they parse; a call cut short keeps the parameters it has.
    const ChatTools coder_tools = tools_for(ToolFormat::Qwen3Coder);
    r = chat_tools_parse(ToolFormat::Qwen3Coder,
                         "Looking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n5\n"
                         "</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n"
                         "</tool_call>\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</"
                         "parameter>\n<parameter=b>\n3\n</param",
                         "c", &coder_tools);
    CHECK(r.content == "Looking.");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(r.calls[0].arguments == R"({"city":"5","unit":"celsius"})");
    CHECK(r.calls[1].name == "add");
    CHECK(r.calls[1].arguments == R"({"a":2,"b":3})");
    r = chat_tools_parse(ToolFormat::Qwen3Coder,
                         "<tool_call>\n<function=note>\n<parameter=text>\nline one\nline "
                         "two\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n</"
                         "function>\n</tool_call>",
                         "c");
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].arguments == R"({"text":"line one\nline two","tags":["a"]})");
    CHECK(chat_tools_parse(ToolFormat::Qwen3Coder, "<tool_call>\n<funct", "c").content ==
          "<tool_call>\n<funct");

    // DeepSeek R1: calls after the text, each its name then a ```json block.
    r = chat_tools_parse(
        ToolFormat::DeepSeekR1,
        "Let me add.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        "add\n```json\n{\"a\": 1, \"b\": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁"
        "begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "c");
    CHECK(r.content == "Let me add.");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":1,"b":2})");
    CHECK(r.calls[1].name == "get_weather");
    CHECK(chat_tools_parse(ToolFormat::DeepSeekR1, "<｜tool▁calls▁begin｜>oops", "c").content ==
          "<｜tool▁calls▁begin｜>oops");

    // Streams: at every point the text shown is a prefix of the final content.
    const std::vector<std::pair<ToolFormat, std::string>> replies = {
        {ToolFormat::Hermes,
         "Let me look.  \n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>"},
        {ToolFormat::Hermes, "A story about <tool and <b>bold</b> text.\n"},
        {ToolFormat::Llama3, R"(  {"name": "add", "parameters": {}})"},
        {ToolFormat::Llama3, "  It is five."},
        {ToolFormat::MistralNemo, R"([{"name": "add", "arguments": {}}])"},
        {ToolFormat::MistralNemo, "Five."},
        {ToolFormat::MistralV11, "Sure: [TOOL_CALLS]add[ARGS]{\"a\": 1, \"b\": 2}"},
        {ToolFormat::MistralV11, "Arrays [TOOL are [1, 2] "},
        {ToolFormat::Qwen3Coder, "Sure.\n<tool_call>\n<function=add>\n</function>\n</tool_call>"},
        {ToolFormat::DeepSeekR1,
         "Sure. <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁"
         "sep｜>add\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
    };
    for (const auto& [format, reply] : replies) {
        CAPTURE(reply);
        const std::string content = chat_tools_parse(format, reply, "c").content;
        size_t shown = 0;
        for (size_t n = 0; n <= reply.size(); ++n) {
            const ToolAnswerPrefix a = tool_stream_content(format, reply.substr(0, n));
            if (!a.answer) continue;
            CHECK(content.compare(0, a.text.size(), a.text) == 0);
            CHECK(a.text.size() >= shown);  // never takes back what it showed
            shown = a.text.size();
        }
        if ((format == ToolFormat::Hermes || format == ToolFormat::MistralV11 ||
             format == ToolFormat::Qwen3Coder || format == ToolFormat::DeepSeekR1) &&
            reply.find("<tool_call>") == std::string::npos &&
            reply.find("[TOOL_CALLS]") == std::string::npos &&
            reply.find("<｜") == std::string::npos)
            CHECK(shown ==
                  std::string(reply).find_last_not_of(" \n") + 1);  // all but the end's space
    }
    // "<tool" at the end of a Hermes stream waits: it may become a call.
    CHECK(tool_stream_content(ToolFormat::Hermes, "Hi <tool").text == "Hi");
    CHECK(tool_stream_content(ToolFormat::Hermes, "Hi <tooth").text == "Hi <tooth");
    CHECK(tool_stream_content(ToolFormat::MistralV11, "Hi [TOOL_C").text == "Hi");
}
