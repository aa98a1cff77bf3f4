// Tool syntaxes of GLM 4.5 (<tool_call>name with <arg_key>/<arg_value> pairs), Kimi K2
// (functions.NAME:N between its section and call tags), DeepSeek V3.1 (name, separator,
// arguments between its call tags) and Command R7B (a plan, then a JSON
// list of {tool_call_id, tool_name, parameters} between its action tags): detection (GLM's template
// also holds Hermes's <tool_call>), the template's rendering of a call and its result (expected
// texts from jinja2 3.1.6 on the same templates), grammars that admit exactly calls of listed tools
// (with the tags as control tokens too), replies read back and streamed. Over HTTP, both join
// the sweep of test_server_tool_http.cpp.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "grammar.h"
#include "modes/server_tools.h"
#include "server_test_util.h"
#include "tool_templates.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::string render(const char* source, ToolFormat format) {
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
        "description": "Adds.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}])");
    return chat_tools_render(JinjaTemplate::parse(source), format,
                             chat_messages_native(ojson::parse(kHistory)), tools, {});
}

}  // namespace

TEST_CASE("tool families: detected, and the template writes calls and results as jinja2 does") {
    CHECK(tool_format_detect(kGlm45) == ToolFormat::Glm45);
    CHECK(tool_format_detect(kKimiK2) == ToolFormat::KimiK2);
    CHECK(std::string(tool_format_name(ToolFormat::Glm45)) == "glm-4.5");
    CHECK(std::string(tool_format_name(ToolFormat::KimiK2)) == "kimi-k2");
    // Hermes's tag alone is still Hermes.
    CHECK(tool_format_detect("<tool_call>{{ tools | tojson }}</tool_call>") == ToolFormat::Hermes);

    // GLM: a null content would be written "None"; the server gives "".
    CHECK(render(kGlm45, ToolFormat::Glm45) ==
          "[gMASK]<sop><|system|>\nCall a tool as <tool_call>NAME\n<arg_key>KEY</arg_key>\n"
          "<arg_value>VALUE</arg_value>\n</tool_call>\n<tools>\n{\"type\": \"function\", "
          "\"function\": {\"name\": \"add\", \"description\": \"Adds.\", \"parameters\": "
          "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}\n</tools>"
          "<|system|>\nBe brief.<|user|>\n2+3?<|assistant|>\n<tool_call>add<arg_key>a</arg_key>"
          "\n<arg_value>2</arg_value><arg_key>b</arg_key>\n<arg_value>3</arg_value></tool_call>"
          "<|observation|>\n<tool_response>\n5\n</tool_response><|user|>\nAnd 4+4?<|assistant|>");
    CHECK(chat_messages_for_format(
              ToolFormat::Glm45, chat_messages_native(ojson::parse(kHistory)))[2]["content"] == "");
    CHECK(render(kKimiK2, ToolFormat::KimiK2) ==
          "<|im_system|>tool_declare<|im_middle|>[{\"type\": \"function\", \"function\": "
          "{\"name\": \"add\", \"description\": \"Adds.\", \"parameters\": {\"type\": "
          "\"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}]<|im_end|><|im_"
          "system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>2+3?<|im_"
          "end|><|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_"
          "begin|>abcDEF123<|tool_call_argument_begin|>{\"a\": 2, \"b\": 3}<|tool_call_end|><|"
          "tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>## Return of "
          "abcDEF123\n5<|im_end|><|im_user|>user<|im_middle|>And 4+4?<|im_end|><|im_assistant|>"
          "assistant<|im_middle|>");
}

TEST_CASE("tool families: GLM 4.5's key and value tags") {
    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    const std::string weather =
        "get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
        "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>";
    const std::string add =
        "add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n"
        "<arg_value>3</arg_value>\n</tool_call>";
    auto required =
        Grammar::parse(chat_tools_grammar(tools_for(ToolFormat::Glm45, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, "<tool_call>" + weather));
    CHECK(grammar_accepts(*required, "<tool_call>" + weather + "\n<tool_call>" + add));
    // (the template's own rendering: no new lines around the tags)
    CHECK(grammar_accepts(*required,
                          "<tool_call>add<arg_key>a</arg_key><arg_value>2</arg_value><arg_key>b"
                          "</arg_key><arg_value>3</arg_value></tool_call>"));
    CHECK_FALSE(grammar_accepts(*required, weather));  // the tag first
    CHECK_FALSE(grammar_accepts(*required, "<tool_call>rm\n</tool_call>"));
    CHECK_FALSE(grammar_accepts(*required,  // a required argument left out
                                "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>"
                                "\n</tool_call>"));
    CHECK_FALSE(grammar_accepts(*required,  // not an integer
                                "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>two</arg_"
                                "value>\n<arg_key>b</arg_key>\n<arg_value>3</arg_value>\n</tool_"
                                "call>"));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::Glm45, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, "<tool_call>" + weather + "\n<tool_call>" + add));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::Glm45), *tok);
    REQUIRE(lazy.triggers.size() == 1);  // (this vocabulary has no such token: its text)
    CHECK(lazy.triggers[0]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf), add));

    // Read back: a string as it is (even when it reads as JSON), other values as JSON.
    ChatTools string_city = tools_for(ToolFormat::Glm45);
    ChatToolReply r = chat_tools_parse(
        ToolFormat::Glm45,
        "<think>x</think>Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>"
        "42</arg_value>\n<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>\n"
        "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n"
        "<arg_value>3</arg_value>\n</tool_call>",
        "c", &string_city);
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(r.calls[0].arguments == R"({"city":"42","unit":"celsius"})");
    CHECK(r.calls[1].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[1].id == "c_1");
    CHECK(r.content == "<think>x</think>Checking.");
    // Cut short inside a value's closing tag: the value so far.
    r = chat_tools_parse(ToolFormat::Glm45,
                         "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_v",
                         "c", &string_city);
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].arguments == R"({"city":"Oslo"})");
    CHECK(chat_tools_parse(ToolFormat::Glm45, "No call.", "c").content == "No call.");
    CHECK(tool_stream_content(ToolFormat::Glm45, "Sure <tool_").text == "Sure");
    CHECK(tool_stream_content(ToolFormat::Glm45, "Sure <tool_call>add").text == "Sure");
}

TEST_CASE("tool families: Kimi K2's sections, with the model's ids") {
    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    auto call = [](const std::string& id, const std::string& args) {
        return "<|tool_call_begin|>" + id + "<|tool_call_argument_begin|>" + args +
               "<|tool_call_end|>";
    };
    const std::string add = call("functions.add:0", R"({"a": 2, "b": 3})");
    const std::string weather =
        call("functions.get_weather:1", R"({"city": "Oslo", "unit": "celsius"})");
    const std::string begin = "<|tool_calls_section_begin|>", end = "<|tool_calls_section_end|>";
    auto required =
        Grammar::parse(chat_tools_grammar(tools_for(ToolFormat::KimiK2, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, begin + add + end));
    CHECK(grammar_accepts(*required, begin + add + weather + end));
    CHECK_FALSE(grammar_accepts(*required, add + end));  // the section's tag first
    CHECK_FALSE(grammar_accepts(*required, begin + call("functions.rm:0", "{}") + end));
    CHECK_FALSE(grammar_accepts(*required, begin + call("functions.add:x", "{}") + end));
    CHECK_FALSE(grammar_accepts(*required,
                                begin + call("functions.add:0", R"({"a": "two", "b": 3})") + end));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::KimiK2, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, begin + add + weather + end));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::KimiK2), *tok);
    REQUIRE(lazy.triggers.size() == 1);
    CHECK(lazy.triggers[0]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf), add + end));

    // Read back: the model's ids kept (unique, functions.NAME:N); others replaced.
    ChatToolReply r =
        chat_tools_parse(ToolFormat::KimiK2, "Both." + begin + add + weather + end, "c");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.content == "Both.");
    CHECK(r.calls[0].id == "functions.add:0");
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[1].id == "functions.get_weather:1");
    CHECK(r.calls[1].name == "get_weather");
    r = chat_tools_parse(ToolFormat::KimiK2, begin + add + add + call("add", "{}") + end, "c");
    REQUIRE(r.calls.size() == 3);
    CHECK(r.calls[0].id == "functions.add:0");
    CHECK(r.calls[1].id == "c_1");  // (the same id again)
    CHECK(r.calls[2].id == "c_2");  // (no functions. prefix)
    CHECK(r.calls[2].name == "add");
    CHECK(chat_tools_parse(ToolFormat::KimiK2, begin + "oops", "c").content == begin + "oops");
    CHECK(tool_stream_content(ToolFormat::KimiK2, "Sure <|tool_calls_sec").text == "Sure");

    // With Kimi's tags as control tokens: the grammar writes them as tokens and the reply
    // shows them; the lazy grammar starts at the section's token.
    Served s(with_control_tokens(path,
                                 {{"<0x00>", "<|tool_calls_section_begin|>"},
                                  {"<0x01>", "<|tool_calls_section_end|>"},
                                  {"<0x02>", "<|tool_call_begin|>"},
                                  {"<0x03>", "<|tool_call_argument_begin|>"},
                                  {"<0x04>", "<|tool_call_end|>"}},
                                 "kvrun-test-kimi-tokens.gguf"),
             /*n_ctx=*/256);
    const Tokenizer& ktok = *s.m.tokenizer;
    const ToolGrammar tokens = chat_tools_grammar(tools_for(ToolFormat::KimiK2), ktok);
    REQUIRE(tokens.triggers.size() == 1);
    CHECK(tokens.triggers[0]["type"] == "token");
    CHECK(tokens.triggers[0]["token"] == ktok.find_token("<|tool_calls_section_begin|>"));
    CHECK(tokens.preserved.size() == 5);
    CHECK(tokens.gbnf.find(fmt::format("<[{}]>", ktok.find_token("<|tool_call_end|>"))) !=
          std::string::npos);
}

TEST_CASE("tool families: DeepSeek V3.1's calls, told from R1's") {
    CHECK(tool_format_detect(kDeepSeekV31) == ToolFormat::DeepSeekV31);
    CHECK(tool_format_detect(kDeepSeekR1) == ToolFormat::DeepSeekR1);  // (its ```json block)
    CHECK(std::string(tool_format_name(ToolFormat::DeepSeekV31)) == "deepseek-v3.1");
    // The arguments are added to a string, so the call's object goes to the template as JSON
    // text; the expected text is jinja2 3.1.6's (trim_blocks, lstrip_blocks, as Hugging Face
    // renders) on the same template and conversation, but for tojson's key order (jinja2 sorts).
    CHECK(
        render(kDeepSeekV31, ToolFormat::DeepSeekV31) ==
        "Be brief.\n## Tools\n### add\nDescription: Adds.\nParameters: {\"type\": "
        "\"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}\nCall tools as "
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>\n<｜User｜>2+3?<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool"
        "▁call▁begin｜>add<｜tool▁sep｜>{\"a\":2,\"b\":3}<｜tool▁call▁end｜><｜tool▁calls▁"
        "end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>5<｜tool▁output▁end｜><｜User｜>And "
        "4+4?<｜Assistant｜></think>");

    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    auto call = [](const std::string& name, const std::string& args) {
        return "<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>" + args + "<｜tool▁call▁end｜>";
    };
    const std::string add = call("add", R"({"a": 2, "b": 3})");
    const std::string weather = call("get_weather", R"({"city": "Oslo", "unit": "celsius"})");
    const std::string begin = "<｜tool▁calls▁begin｜>", end = "<｜tool▁calls▁end｜>";
    auto required = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::DeepSeekV31, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, begin + add + end));
    CHECK(grammar_accepts(*required, begin + weather + add + end));
    CHECK_FALSE(grammar_accepts(*required, add + end));    // the calls' tag first
    CHECK_FALSE(grammar_accepts(*required, begin + add));  // and last
    CHECK_FALSE(grammar_accepts(*required, begin + call("rm", "{}") + end));
    CHECK_FALSE(grammar_accepts(*required, begin + call("add", R"({"a": "two", "b": 3})") + end));
    CHECK_FALSE(grammar_accepts(  // R1's form is not V3.1's
        *required, begin +
                       "<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 2, "
                       "\"b\": 3}\n```<｜tool▁call▁end｜>" +
                       end));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::DeepSeekV31, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, begin + add + weather + end));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::DeepSeekV31), *tok);
    REQUIRE(lazy.triggers.size() == 1);
    CHECK(lazy.triggers[0]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf), add + end));
    auto open = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::DeepSeekV31, "required"), *tok, ToolThinking::Open)
            .gbnf);
    CHECK(grammar_accepts(*open, "Sum them.</think>\n\n" + begin + add + end));

    // Read back: text before the calls is the content; a cut call is text.
    ChatToolReply r =
        chat_tools_parse(ToolFormat::DeepSeekV31, "Both.\n" + begin + add + weather + end, "c");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.content == "Both.");
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[1].name == "get_weather");
    CHECK(r.calls[1].arguments == R"({"city":"Oslo","unit":"celsius"})");
    CHECK(chat_tools_parse(ToolFormat::DeepSeekV31, begin + "oops", "c").content == begin + "oops");
    CHECK(chat_tools_parse(ToolFormat::DeepSeekV31, begin + call("add", "{\"a\": 2"), "c")
              .calls.empty());
    CHECK(tool_stream_content(ToolFormat::DeepSeekV31, "Sure <｜tool▁ca").text == "Sure");
    CHECK(tool_stream_content(ToolFormat::DeepSeekV31, "Sure " + begin + add).text == "Sure");
}

TEST_CASE("tool families: Command R7B's plan, action list and response tags") {
    CHECK(tool_format_detect(kCommandR7B) == ToolFormat::CommandR7B);
    CHECK(std::string(tool_format_name(ToolFormat::CommandR7B)) == "command-r7b");
    // The template writes an earlier reply's plan from its reasoning_content (expected text
    // from jinja2 3.1.6 on the same template).
    ojson history = ojson::parse(kHistory);
    history[2]["reasoning_content"] = "I will add.";
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "add",
        "description": "Adds.", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}])");
    CHECK(chat_tools_render(JinjaTemplate::parse(kCommandR7B), ToolFormat::CommandR7B,
                            chat_messages_native(history), tools, {}) ==
          "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Plan, then call tools as <|START_ACTION|>"
          "[{\"tool_call_id\": \"0\", \"tool_name\": \"NAME\", \"parameters\": {}}]"
          "<|END_ACTION|>, or answer as <|START_RESPONSE|>TEXT<|END_RESPONSE|>.Tools:"
          "{\"name\": \"add\", \"description\": \"Adds.\", \"parameters\": {\"type\": "
          "\"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}<|END_OF_TURN_"
          "TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|><|START_"
          "OF_TURN_TOKEN|><|USER_TOKEN|>2+3?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|"
          "CHATBOT_TOKEN|><|START_THINKING|>I will add.<|END_THINKING|><|START_ACTION|>[{\"tool_"
          "call_id\": \"0\", \"tool_name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}]"
          "<|END_ACTION|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_"
          "TOOL_RESULT|>5<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_"
          "TOKEN|>And 4+4?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");

    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    const std::string add =
        R"({"tool_call_id": "0", "tool_name": "add", "parameters": {"a": 2, "b": 3}})";
    const std::string weather =
        R"({"tool_call_id": "1", "tool_name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}})";
    const std::string open = "<|START_ACTION|>", close = "<|END_ACTION|>";
    auto required = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::CommandR7B, "required"), *tok).gbnf);
    CHECK(grammar_accepts(*required, open + "[" + add + "]" + close));
    CHECK(grammar_accepts(*required, open + "[\n    " + add + ",\n    " + weather + "\n]" + close));
    CHECK(grammar_accepts(*required, "<|START_THINKING|>I will add them.<|END_THINKING|>" + open +
                                         "[" + add + "]" + close));
    CHECK_FALSE(grammar_accepts(*required, "[" + add + "]" + close));  // the tag first
    CHECK_FALSE(grammar_accepts(
        *required,
        open + R"([{"tool_call_id": "0", "tool_name": "rm", "parameters": {}}])" + close));
    CHECK_FALSE(grammar_accepts(
        *required,
        open + R"([{"tool_call_id": "x", "tool_name": "add", "parameters": {"a": 2, "b": 3}}])" +
            close));
    CHECK_FALSE(grammar_accepts(
        *required,
        open +
            R"([{"tool_call_id": "0", "tool_name": "add", "parameters": {"a": "two", "b": 3}}])" +
            close));
    auto single = Grammar::parse(
        chat_tools_grammar(tools_for(ToolFormat::CommandR7B, "required", false), *tok).gbnf);
    CHECK_FALSE(grammar_accepts(*single, open + "[" + add + ", " + weather + "]" + close));
    const ToolGrammar lazy = chat_tools_grammar(tools_for(ToolFormat::CommandR7B), *tok);
    REQUIRE(lazy.triggers.size() == 1);
    CHECK(lazy.triggers[0]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(lazy.gbnf), "[" + add + "]" + close));  // after the tag

    // Read back: the calls (ids ours), the plan left out of the content, an answer's tags off.
    ChatToolReply r = chat_tools_parse(
        ToolFormat::CommandR7B,
        "<|START_THINKING|>Both.<|END_THINKING|>" + open + "[" + add + ", " + weather + "]" + close,
        "c");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.content.empty());
    CHECK(r.calls[0].name == "add");
    CHECK(r.calls[0].arguments == R"({"a":2,"b":3})");
    CHECK(r.calls[0].id == "c_0");
    CHECK(r.calls[1].name == "get_weather");
    r = chat_tools_parse(ToolFormat::CommandR7B,
                         "<|START_THINKING|>No tool.<|END_THINKING|><|START_RESPONSE|>It is 5."
                         "<|END_RESPONSE|>",
                         "c");
    CHECK(r.calls.empty());
    CHECK(r.content == "It is 5.");
    CHECK(chat_tools_parse(ToolFormat::CommandR7B, "Plain words.", "c").content == "Plain words.");
    CHECK(chat_tools_parse(ToolFormat::CommandR7B, open + "[oops", "c").content == open + "[oops");
    // Streamed: nothing of the plan, the answer without its tags, a tag's beginning held back.
    CHECK(tool_stream_content(ToolFormat::CommandR7B, "<|START_THINKING|>Hm").text.empty());
    CHECK(tool_stream_content(ToolFormat::CommandR7B,
                              "<|START_THINKING|>Hm<|END_THINKING|><|START_RESPONSE|>It is <|END_")
              .text == "It is");
    CHECK(tool_stream_content(ToolFormat::CommandR7B, "Sure <|START_ACTION|>[").text == "Sure");
}

TEST_CASE("tool families: Llama 3.1's built-in tools") {
    // brave_search / web_search / wolfram_alpha are called as
    // <|python_tag|>NAME.call(ARG="VALUE"), python / code_interpreter with their code after
    // the tag; the template is told their names (expected text from jinja2 3.1.6 with
    // trim_blocks, lstrip_blocks and transformers' tojson, on the same template).
    CHECK(tool_format_detect(kLlama31) == ToolFormat::Llama3);
    const ojson tools = ojson::parse(R"([
      {"type": "function", "function": {"name": "brave_search", "description": "Search the web",
       "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                      "required": ["query"]}}},
      {"type": "function", "function": {"name": "code_interpreter", "description": "Run Python",
       "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                      "required": ["code"]}}},
      {"type": "function", "function": {"name": "add", "description": "Add",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                      "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
    const ojson history = ojson::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "brave_search", "arguments": "{\"query\": \"weather in Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 20 C"},
      {"role": "assistant", "content": "Sunny."},
      {"role": "user", "content": "And 2+3?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function",
       "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
      {"role": "tool", "tool_call_id": "c2", "content": "5"},
      {"role": "user", "content": "Thanks"}])");
    // (A leading BOS text is left to the tokenizer: here none.)
    CHECK(chat_tools_render(JinjaTemplate::parse(kLlama31), ToolFormat::Llama3,
                            chat_messages_native(history), tools, {}) ==
          "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: "
          "ipython\nTools: brave_search\n\nTo call a function, reply with {\"name\": <name>, "
          "\"parameters\": <arguments>}. The functions:\n{\"type\": \"function\", \"function\": "
          "{\"name\": \"brave_search\", \"description\": \"Search the web\", \"parameters\": "
          "{\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"}}, "
          "\"required\": [\"query\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": "
          "\"code_interpreter\", \"description\": \"Run Python\", \"parameters\": {\"type\": "
          "\"object\", \"properties\": {\"code\": {\"type\": \"string\"}}, \"required\": "
          "[\"code\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"add\", "
          "\"description\": \"Add\", \"parameters\": {\"type\": \"object\", \"properties\": "
          "{\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"}}, \"required\": "
          "[\"a\", \"b\"]}}}\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
          "Weather in Oslo?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<|python_"
          "tag|>brave_search.call(query=\"weather in Oslo\")<|eom_id|><|start_header_id|>"
          "ipython<|end_header_id|>\n\nSunny, 20 C<|eot_id|><|start_header_id|>assistant<|end_"
          "header_id|>\n\nSunny.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 2+3?"
          "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"add\", "
          "\"parameters\": {\"a\": 2, \"b\": 3}}<|eom_id|><|start_header_id|>ipython<|end_"
          "header_id|>\n\n5<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");

    // Replies: a built-in call's arguments (quoted strings with JSON escapes, other values as
    // JSON), a code tool's code under the listed code tool's name, JSON calls as before.
    ChatTools listed = *chat_tools_from_json({{"tools", tools}});
    listed.format = ToolFormat::Llama3;
    ChatToolReply r = chat_tools_parse(
        ToolFormat::Llama3, "<|python_tag|>brave_search.call(query=\"weather in \\\"Oslo\\\"\")",
        "c", &listed);
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "brave_search");
    CHECK(r.calls[0].arguments == R"({"query":"weather in \"Oslo\""})");
    CHECK(r.content.empty());
    r = chat_tools_parse(ToolFormat::Llama3,
                         "<|python_tag|> wolfram_alpha . call( query = \"2+2\" , n=3 ) ", "c");
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "wolfram_alpha");
    CHECK(r.calls[0].arguments == R"({"query":"2+2","n":3})");
    r = chat_tools_parse(ToolFormat::Llama3, "<|python_tag|>print(2 + 3)\n", "c", &listed);
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "code_interpreter");
    CHECK(r.calls[0].arguments == R"j({"code":"print(2 + 3)"})j");
    r = chat_tools_parse(ToolFormat::Llama3, "<|python_tag|>x = 1", "c");
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "python");  // no code tool listed: llama.cpp's name
    r = chat_tools_parse(ToolFormat::Llama3, R"(<|python_tag|>{"name": "add", "parameters": {}})",
                         "c", &listed);
    REQUIRE(r.calls.size() == 1);
    CHECK(r.calls[0].name == "add");
    CHECK(
        chat_tools_parse(ToolFormat::Llama3, "Call brave_search.call(query=\"x\")", "c").content ==
        "Call brave_search.call(query=\"x\")");  // no tag: words

    // Grammars (this vocabulary has no <|python_tag|> token: the tag is text).
    const std::string path = model_path();
    if (path.empty()) return;
    GgufFile file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(file);
    ChatTools required = listed;
    required.required = true;
    auto g = Grammar::parse(chat_tools_grammar(required, *tok).gbnf);
    CHECK(grammar_accepts(*g, R"({"name": "add", "parameters": {"a": 2, "b": 3}})"));
    CHECK(grammar_accepts(*g, "<|python_tag|>brave_search.call(query=\"weather in Oslo\")"));
    CHECK(grammar_accepts(*g, "<|python_tag|>print(2 + 3)\nprint(4)"));
    ojson no_code = tools;
    no_code.erase(1);
    ChatTools strict = *chat_tools_from_json({{"tools", no_code}, {"tool_choice", "required"}});
    strict.format = ToolFormat::Llama3;
    g = Grammar::parse(chat_tools_grammar(strict, *tok).gbnf);
    CHECK(grammar_accepts(*g, "<|python_tag|>brave_search.call(query=\"x\")"));
    CHECK(grammar_accepts(*g, "<|python_tag|>brave_search.call()"));
    CHECK_FALSE(grammar_accepts(*g, "<|python_tag|>brave_search.call(q=\"x\")"));
    CHECK_FALSE(grammar_accepts(*g, "<|python_tag|>wolfram_alpha.call(query=\"x\")"));
    CHECK_FALSE(grammar_accepts(*g, "<|python_tag|>print(1)"));
    // "auto": lazy, from "{" or after the tag (a pattern here, the token where there is one).
    ChatTools lazy = strict;
    lazy.required = false;
    const ToolGrammar auto_g = chat_tools_grammar(lazy, *tok);
    REQUIRE(auto_g.triggers.size() == 2);
    CHECK(auto_g.triggers[1]["type"] == "pattern");
    CHECK(grammar_accepts(*Grammar::parse(auto_g.gbnf), "brave_search.call(query=\"x\")"));
    // Without built-in tools the grammar is as it was.
    CHECK(chat_tools_grammar(tools_for(ToolFormat::Llama3), *tok).gbnf.find("builtin") ==
          std::string::npos);
}
