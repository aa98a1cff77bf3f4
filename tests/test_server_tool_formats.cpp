// Tool calls in a model family's own syntax (ToolFormat, server_tool_formats.cpp): which
// templates show which syntax; the template renders the tools, earlier calls and results
// exactly as Python's jinja2 does (the expected texts come from jinja2 3.1.6 on the same
// templates); each format's grammar admits exactly calls of listed tools; replies are read
// back (text before Hermes calls, Mistral's 9-character ids); a stream shows only content that
// the final reply keeps; and over HTTP, stories260K through each template writes well-formed
// calls when one is required, and plain content (streamed the same) when it may answer.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "chat_template.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "grammar.h"
#include "json_schema.h"
#include "modes/server_tools.h"
#include "server_test_util.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Six templates written for these tests in the styles of Hermes/Qwen, Llama 3.1, Mistral
// Nemo, Mistral Small 3.2, Qwen3-Coder and DeepSeek R1 (not those models' own texts).
const char* const kHermes = R"tmpl({%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call functions. Their signatures:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": <name>, "arguments": <arguments>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}
{%- for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% if not loop.last %}
{% endif %}{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
)tmpl";

const char* const kLlama3 = R"tmpl(<|start_header_id|>system<|end_header_id|>

{% if tools %}Environment: ipython
To call a function, reply with {"name": <name>, "parameters": <arguments>} and nothing else. The functions:
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}<|eot_id|>
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% set call = message.tool_calls[0].function %}{"name": "{{ call.name }}", "parameters": {{ call.arguments | tojson }}}<|eot_id|>
{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- elif message.role != 'system' %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}
)tmpl";

const char* const kMistral = R"tmpl({%- for message in messages %}
{%- if message.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS][
{%- for c in message.tool_calls %}
{%- if c.id is not defined or c.id | length != 9 %}{{ raise_exception("tool call ids must be 9 letters or digits") }}{% endif %}
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, "id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}
{%- endfor %}]{{ eos_token }}
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{"content": {{ message.content | tojson }}, "call_id": "{{ message.tool_call_id }}"}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}
)tmpl";

const char* const kMistralV11 = R"tmpl({%- for message in messages %}
{%- if message.role == 'system' %}[SYSTEM_PROMPT]{{ message.content }}[/SYSTEM_PROMPT]
{%- elif message.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}
{%- for c in message.tool_calls %}[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}{{ eos_token }}
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{{ message.content }}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}
)tmpl";

const char* const kQwen3Coder =
    R"tmpl({%- if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}
{%- if system is defined or tools %}<|im_start|>system
{% if system is defined %}{{ system }}{% endif %}
{%- if tools %}

Functions:
<tools>
{%- for tool in tools %}{% set f = tool.function %}
<function><name>{{ f.name }}</name>
{%- for pname, pfields in f.parameters.properties | items %}
<parameter><name>{{ pname }}</name>{% if pfields.type is defined %}<type>{{ pfields.type | string }}</type>{% endif %}</parameter>
{%- endfor %}
</function>
{%- endfor %}
</tools>
Call one as <tool_call>
<function=NAME>
<parameter=NAME>
VALUE
</parameter>
</function>
</tool_call>
{%- endif %}<|im_end|>
{% endif %}
{%- for message in rest %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
<function={{ call.function.name }}>
{% for name, value in call.function.arguments | items %}<parameter={{ name }}>
{{ value | tojson if value is mapping or (value is sequence and value is not string) else value | string }}
</parameter>
{% endfor %}</function>
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.previtem and loop.previtem.role != 'tool' %}<|im_start|>user
{% endif %}<tool_response>
{{ message.content }}
</tool_response>
{% if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>
{% endif %}
{%- else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
)tmpl";

// Adds a call's arguments to a string, as DeepSeek R1's template does: they must be text.
const char* const kDeepSeekR1 =
    R"tmpl({%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}
{%- if tools %}

## Tools
{% for t in tools %}{{ t.function | tojson }}
{% endfor %}{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<｜User｜>{{ m.content }}
{%- elif m.role == 'assistant' and m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>
{%- for c in m.tool_calls %}{{ '<｜tool▁call▁begin｜>' + c.type + '<｜tool▁sep｜>' + c.function.name + '\n```json\n' + c.function.arguments + '\n```<｜tool▁call▁end｜>' }}{% endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
{%- elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>
{%- elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{% endif %}
)tmpl";

// A copy of the model with two byte tokens its stories never use (<0x00>, <0x01>) turned into
// Mistral's control tokens [TOOL_CALLS] and [ARGS]: the native tool syntax through real
// control tokens (no text of their own) on a model that runs here.
std::string with_mistral_tokens(const std::string& path) {
    GgufFile in = GgufFile::open(path);
    GgufWriter w(static_cast<uint32_t>(in.alignment()));
    for (const auto& [key, value] : in.metadata()) w.set_value(key, value);
    std::vector<std::string> tokens;
    for (const GgufValue& v : in.get_array("tokenizer.ggml.tokens"))
        tokens.push_back(v.as_string());
    std::vector<int32_t> types;
    for (const GgufValue& v : in.get_array("tokenizer.ggml.token_type"))
        types.push_back(static_cast<int32_t>(v.as_int()));
    const std::pair<const char*, const char*> renamed[] = {{"<0x00>", "[TOOL_CALLS]"},
                                                           {"<0x01>", "[ARGS]"}};
    for (const auto& [from, to] : renamed) {
        const auto it = std::find(tokens.begin(), tokens.end(), from);
        REQUIRE(it != tokens.end());
        *it = to;
        types[static_cast<size_t>(it - tokens.begin())] = 3;  // control
    }
    w.set_array_str("tokenizer.ggml.tokens", tokens);
    w.set_array_i32("tokenizer.ggml.token_type", types);
    for (const GgufTensorInfo& t : in.tensors())
        w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
    const std::string out =
        (std::filesystem::temp_directory_path() / "kvrun-test-mistral-tokens.gguf").string();
    w.write_file(out);
    return out;
}

ChatTools tools_for(ToolFormat format, const std::string& choice = "auto", bool parallel = true) {
    ojson req = {
        {"tools", weather_and_add()}, {"tool_choice", choice}, {"parallel_tool_calls", parallel}};
    ChatTools t = *chat_tools_from_json(req);
    t.format = format;
    return t;
}

// The conversation of the rendering test: a call with its id, its result, a new question.
const char* kHistory = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "2+3?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123", "type": "function",
    "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
  {"role": "tool", "tool_call_id": "abcDEF123", "content": "5"},
  {"role": "user", "content": "And 4+4?"}])";

}  // namespace

TEST_CASE("tool formats: detected from the template's own syntax") {
    CHECK(tool_format_detect(kHermes) == ToolFormat::Hermes);
    CHECK(tool_format_detect(kLlama3) == ToolFormat::Llama3);
    CHECK(tool_format_detect(kMistral) == ToolFormat::MistralNemo);
    CHECK(tool_format_detect(kMistralV11) == ToolFormat::MistralV11);
    CHECK(std::string(tool_format_name(ToolFormat::MistralV11)) == "mistral-v11");
    CHECK(tool_format_detect(kQwen3Coder) == ToolFormat::Qwen3Coder);
    CHECK(std::string(tool_format_name(ToolFormat::Qwen3Coder)) == "qwen3-coder");
    CHECK(tool_format_detect(kDeepSeekR1) == ToolFormat::DeepSeekR1);
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

TEST_CASE("server: tools in each template's own syntax, whole and streamed") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, /*n_ctx=*/2048);
    const json tools = json::parse(weather_and_add().dump());
    const json messages = {{{"role", "user"}, {"content", "What is 2 plus 3?"}}};
    const std::set<std::string> both = {"get_weather", "add"};
    const struct {
        const char* source;
        ChatTemplateKind kind;  // its end-of-turn texts stop replies
    } templates[] = {
        {kHermes, ChatTemplateKind::ChatML},
        {kLlama3, ChatTemplateKind::Llama3},
        {kMistral, ChatTemplateKind::MistralV3},
        {kMistralV11, ChatTemplateKind::MistralV3},
        {kQwen3Coder, ChatTemplateKind::ChatML},
        // (ChatML's stops: with DeepSeek3's the chat would think, and this model never stops)
        {kDeepSeekR1, ChatTemplateKind::ChatML}};
    for (const auto& tc : templates) {
        ServerConfig cfg = s.config();
        s.set_chat(cfg, tc.kind,
                   std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(tc.source)));
        const ToolFormat format = tool_format_detect(tc.source);
        CAPTURE(tool_format_name(format));
        Running run(cfg, s);

        // A required call: well formed, whole and streamed alike.
        json body = {{"messages", messages},      {"tools", tools},
                     {"tool_choice", "required"}, {"parallel_tool_calls", false},
                     {"max_tokens", 400},         {"temperature", 0}};
        HttpReply r = run.post("/v1/chat/completions", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        const json choice = json::parse(r.body)["choices"][0];
        CHECK_MESSAGE(choice["finish_reason"] == "tool_calls", choice.dump());
        REQUIRE(choice["message"]["tool_calls"].size() == 1);
        const json call = choice["message"]["tool_calls"][0];
        check_call(call, both);
        if (format == ToolFormat::MistralNemo || format == ToolFormat::MistralV11)
            CHECK(call["id"].get<std::string>().size() == 9);
        body["stream"] = true;
        json streamed_calls;
        for (const std::string& e : sse_data(run.post("/v1/chat/completions", body).body)) {
            if (e == "[DONE]") continue;
            const json d = json::parse(e)["choices"][0]["delta"];
            CHECK(!(d.contains("content") && d["content"].is_string()));  // no text
            if (d.contains("tool_calls")) streamed_calls = d["tool_calls"];
        }
        REQUIRE(streamed_calls.size() == 1);
        CHECK(streamed_calls[0]["function"] == call["function"]);

        // The prompt the template wrote: its own tool list; with Mistral's required call the
        // reply starts after [TOOL_CALLS].
        const std::string prompt =
            run.post("/apply-template",
                     {{"messages", messages}, {"tools", tools}, {"tool_choice", "required"}})
                .body;
        CHECK(prompt.find("get_weather") != std::string::npos);
        if (format == ToolFormat::MistralNemo) {
            const std::string text = json::parse(prompt)["prompt"];
            CHECK(text.size() >= 12);
            CHECK(text.substr(text.size() - 12) == "[TOOL_CALLS]");
        }

        // The next turn: our call and its result, written back by the template (Mistral's
        // demands the 9-character id it got).
        json history = messages;
        history.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}});
        history.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "5"}});
        const HttpReply next =
            run.post("/apply-template", {{"messages", history}, {"tools", tools}});
        REQUIRE_MESSAGE(next.status == 200, next.body);
        const std::string next_prompt = json::parse(next.body)["prompt"];
        CHECK(next_prompt.find(call["function"]["name"].get<std::string>()) != std::string::npos);
        if (format == ToolFormat::MistralNemo)
            CHECK(next_prompt.find(call["id"].get<std::string>()) != std::string::npos);

        // "auto": the story model answers in words (the grammar waits for a call that does not
        // come); streamed, the deltas add up to the whole content.
        json answer = {
            {"messages", messages}, {"tools", tools}, {"max_tokens", 40}, {"temperature", 0}};
        const json whole = json::parse(run.post("/v1/chat/completions", answer).body)["choices"][0];
        CHECK(whole["finish_reason"] != "tool_calls");
        const std::string content = whole["message"]["content"];
        CHECK(!content.empty());
        answer["stream"] = true;
        std::string streamed;
        for (const std::string& e : sse_data(run.post("/v1/chat/completions", answer).body)) {
            if (e == "[DONE]") continue;
            const json d = json::parse(e)["choices"][0]["delta"];
            if (d.contains("content") && d["content"].is_string())
                streamed += d["content"].get<std::string>();
            CHECK(!d.contains("tool_calls"));
        }
        CHECK(streamed == content);
    }
}

TEST_CASE("server: Mistral's control tokens written by the grammar and shown in the reply") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(with_mistral_tokens(path), /*n_ctx=*/2048);
    const Tokenizer& tok = *s.m.tokenizer;
    const TokenId calls_tag = tok.find_token("[TOOL_CALLS]"), args_tag = tok.find_token("[ARGS]");
    REQUIRE(calls_tag >= 0);
    REQUIRE(args_tag >= 0);
    REQUIRE(tok.is_control(calls_tag));
    const std::vector<TokenId> parsed = tok.encode("x[TOOL_CALLS]y", false, true);
    CHECK(std::count(parsed.begin(), parsed.end(), calls_tag) == 1);

    // The grammars name the tokens; their texts are preserved in the reply.
    const ToolGrammar v11 = chat_tools_grammar(tools_for(ToolFormat::MistralV11, "required"), tok);
    CHECK(v11.gbnf.find(fmt::format("<[{}]>", calls_tag)) != std::string::npos);
    CHECK(v11.gbnf.find(fmt::format("<[{}]>", args_tag)) != std::string::npos);
    CHECK(v11.preserved == std::vector<std::string>{"[TOOL_CALLS]", "[ARGS]"});
    const ToolGrammar v11_auto = chat_tools_grammar(tools_for(ToolFormat::MistralV11), tok);
    CHECK(v11_auto.triggers ==
          json::parse(fmt::format(R"([{{"type": "token", "token": {}}}])", calls_tag)));
    CHECK(chat_tools_grammar(tools_for(ToolFormat::MistralNemo), tok).preserved ==
          std::vector<std::string>{"[TOOL_CALLS]"});

    const json tools = json::parse(weather_and_add().dump());
    const json messages = {{{"role", "user"}, {"content", "What is 2 plus 3?"}}};
    for (const char* source : {kMistralV11, kMistral}) {
        ServerConfig cfg = s.config();
        s.set_chat(cfg, ChatTemplateKind::MistralV3,
                   std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(source)));
        const std::string format = tool_format_name(tool_format_detect(source));
        CAPTURE(format);
        Running run(cfg, s);
        // Required calls (v11: parallel allowed; Nemo's list would go on past max_tokens with
        // this model): every one well formed, streamed alike.
        json body = {{"messages", messages},      {"tools", tools},
                     {"tool_choice", "required"}, {"parallel_tool_calls", format == "mistral-v11"},
                     {"max_tokens", 300},         {"temperature", 0}};
        const HttpReply r = run.post("/v1/chat/completions", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        const json choice = json::parse(r.body)["choices"][0];
        CHECK(choice["finish_reason"] == "tool_calls");
        const json calls = choice["message"]["tool_calls"];
        REQUIRE(calls.size() >= 1);
        for (const json& c : calls) check_call(c, {"get_weather", "add"});
        CHECK(choice["message"]["content"].is_null());
        body["stream"] = true;
        json streamed;
        for (const std::string& e : sse_data(run.post("/v1/chat/completions", body).body)) {
            if (e == "[DONE]") continue;
            const json d = json::parse(e)["choices"][0]["delta"];
            CHECK(!(d.contains("content") && d["content"].is_string()));
            if (d.contains("tool_calls")) streamed = d["tool_calls"];
        }
        REQUIRE(streamed.size() == calls.size());
        for (size_t k = 0; k < calls.size(); ++k)
            CHECK(streamed[k]["function"] == calls[k]["function"]);
        // The calls go back into the next prompt as the control tokens.
        json history = messages;
        history.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}});
        for (const json& c : calls)
            history.push_back({{"role", "tool"}, {"tool_call_id", c["id"]}, {"content", "5"}});
        const HttpReply applied =
            run.post("/apply-template", {{"messages", history}, {"tools", tools}});
        REQUIRE_MESSAGE(applied.status == 200, applied.body);
        const std::string next = json::parse(applied.body)["prompt"];
        const std::vector<TokenId> ids = tok.encode(next, false, true);
        CHECK(std::count(ids.begin(), ids.end(), calls_tag) >= 1);
    }

    // llama.cpp's "preserved_tokens" on /completion: a control token shown as its text.
    ServerConfig cfg = s.config();
    Running run(cfg, s);
    const std::string g = fmt::format(R"(root ::= " Once" <[{}]> " upon")", calls_tag);
    json body = {{"prompt", "Hi"}, {"grammar", g}, {"n_predict", 10}, {"temperature", 0}};
    CHECK(json::parse(run.post("/completion", body).body)["content"] == " Once upon");
    body["preserved_tokens"] = {"[TOOL_CALLS]"};
    CHECK(json::parse(run.post("/completion", body).body)["content"] == " Once[TOOL_CALLS] upon");
    body["preserved_tokens"] = {"two words"};
    const HttpReply bad = run.post("/completion", body);
    CHECK(bad.status == 400);
    CHECK(bad.body.find("is not one token") != std::string::npos);
}
