// OpenAI tool (function) calling for /v1/chat/completions, on any model.
//
// When the chat is rendered by the model's own Jinja template (--jinja, --chat-template-file,
// or a template no built-in format matches) and that template shows a tool syntax the model
// was trained on, the tools use it (ToolFormat, server_tool_formats.cpp): the template itself
// writes the tools and earlier calls and results, a grammar keeps the calls to that syntax,
// and the reply is read back in it. Otherwise every model gets one generic format
// (the idea of llama.cpp's "generic" tool-call handler): the system prompt lists the tools
// as JSON and asks for one JSON object back,
//   {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}   or
//   {"response": "the answer to the user"},
// and a grammar built from the tools' parameter schemas makes that the only thing the model
// can write: a call always names a listed tool and its arguments always match its schema.
// The reply is then read back into OpenAI's message: "tool_calls" (each with an id, the
// name and the arguments as a JSON string; finish_reason "tool_calls") or "content" (which a
// stream shows as it is generated: tool_answer_prefix).
//
// tool_choice: "auto" (call or answer), "required" (at least one call), {"type":
// "function", "function": {"name": ...}} (that tool), "none" (no tools: plain chat).
// parallel_tool_calls: false allows exactly one call per reply.
//
// The conversation may carry earlier calls and their results: an assistant message's
// "tool_calls" are written as the JSON object the model would have produced, and "tool"
// messages (consecutive ones together) as a user message {"tool_results": [{"tool_call_id",
// "name", "content"}]}.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat_template.h"

namespace kvrun {

class Tokenizer;

// A model family's own tool-call syntax:
//   Hermes       <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> after any text
//                (Hermes 2/3 Pro, Qwen 2.5 and 3, ...); several calls one after another;
//   Llama3       the whole reply {"name": ..., "parameters": {...}} (Llama 3.1-3.3); one call;
//   MistralNemo  [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...] (Mistral Nemo
//                and the models sharing its template), the list following the control token;
//   MistralV11   [TOOL_CALLS]name[ARGS]{...} after any text, repeated for more calls (Mistral's
//                tokenizer v11 on: Mistral Small 3.2, Magistral, Devstral); where the
//                vocabulary has [CALL_ID], a call may carry one: name[CALL_ID]abcDEF123[ARGS].
// The Mistral control tokens are written by the grammar as tokens (`<[id]>`) and shown in
// the reply's text (ToolGrammar::preserved) where the vocabulary has them, as text otherwise.
//   Qwen3Coder   <tool_call>\n<function=name>\n<parameter=p>\nvalue\n</parameter>\n...</function>
//                \n</tool_call> (Qwen3-Coder): a string's value is its raw text, others JSON;
//                several calls one after another.
//   DeepSeekR1
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}
//                \n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> after any text (DeepSeek R1 and
//                its distills' template).
//   DeepSeekV31
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//                ...<｜tool▁calls▁end｜> after any text (DeepSeek V3.1: the name, then the
//                arguments as they are, no type and no ```json block).
//   Harmony      a commentary message to "functions.NAME" whose text is the arguments, after
//                any reasoning: <|channel|>commentary to=functions.NAME <|constrain|>json
//                <|message|>{...} (gpt-oss; reasoning.h reads its messages); one call per
//                reply (it ends with <|call|>).
//   Granite      <|tool_call|>[{"name": ..., "arguments": {...}}, ...] after any text (IBM
//                Granite 3.x), the tag a token where the vocabulary has it; the template
//                writes an assistant's content only, so earlier calls go there in this form.
//   Glm45        <tool_call>name\n<arg_key>p</arg_key>\n<arg_value>value</arg_value>\n...
//                </tool_call> after any text (GLM 4.5/4.6): a string's value is its raw text,
//                others JSON; several calls one after another.
//   KimiK2       <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0
//                <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
//                after any text (Kimi K2); the id the model writes (functions.name:N) is the
//                call's id, as its template writes ids back.
//   FunctionaryV31  <function=name>{...}</function> after any text, one or more (MeetKai's
//                Functionary v3.1, on Llama 3.1's headers); a listed tool named "python" is
//                called as <|python_tag|> and the code.
//   FireFunctionV2  functools[{"name": ..., "arguments": {...}}, ...] after any text
//                (Fireworks' FireFunction v2); its template takes the tools as JSON text in
//                "functions" and the date in "datetime".
//   FunctionaryV32  NAME\n{...} right after the prompt's ">>>", more calls each after
//                ">>>" (MeetKai's Functionary v3.2); a reply's text is the part named "all"
//                ("all\nTEXT", before the calls); a listed "python" tool's call is its code.
//   Phi4Mini     <|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|> after any
//                text (Phi-4-mini): the template reads the tools from the system message's
//                "tools" (JSON text, shown between <|tool|> and <|/tool|>) and writes an
//                assistant's content only, so earlier calls go there in this form.
enum class ToolFormat {
    Generic,
    Hermes,
    Llama3,
    MistralNemo,
    MistralV11,
    Qwen3Coder,
    DeepSeekR1,
    DeepSeekV31,
    Harmony,
    Granite,
    Glm45,
    KimiK2,
    CommandR7B,
    Phi4Mini,
    FunctionaryV31,
    FunctionaryV32,
    FireFunctionV2
};

// From a Jinja chat template's source: "<tool_call>" -> Qwen3Coder with "<function=" and
// "<parameter=", else Hermes; "<｜tool▁calls▁begin｜>" -> DeepSeekR1 with "```json" (R1 writes
// the arguments in a JSON block), else DeepSeekV31; "[TOOL_CALLS]" -> MistralV11
// with "[ARGS]", else MistralNemo, "<|start_header_id|>" with "ipython" or "<|python_tag|>" ->
// Llama3, "<|channel|>" with "commentary" and "functions." -> Harmony, "<|tool_call|>" with
// "<|start_of_role|>" -> Granite, "<arg_key>" with "<tool_call>" -> Glm45 (before Hermes),
// "<|tool_calls_section_begin|>" -> KimiK2, "<|START_ACTION|>" -> CommandR7B, "<|tool|>" with
// "<|/tool|>" -> Phi4Mini, "<function=" with "</function>" and "<|start_header_id|>" ->
// FunctionaryV31 (before Llama3), ">>>all" -> FunctionaryV32 (before both), "functools[" ->
// FireFunctionV2, else Generic.
ToolFormat tool_format_detect(std::string_view jinja_source);
// "generic", "hermes", "llama3", "mistral-nemo", "mistral-v11", "qwen3-coder", "deepseek-r1",
// "deepseek-v3.1", "gpt-oss", "granite", "glm-4.5", "kimi-k2", "command-r7b", "phi-4-mini",
// "functionary-v3.1", "functionary-v3.2", "firefunction-v2".
// The model's template for requests with tools while a built-in format renders the rest
// (ChatFormat::tools_jinja): parsed when it shows a native syntax and renders a conversation
// with a call and its result that shows the tool; null otherwise (the generic format then).
std::shared_ptr<const JinjaTemplate> native_tools_template(const std::string& source);
const char* tool_format_name(ToolFormat format);

struct ChatTools {
    // [{"name", "description"?, "parameters"}], as the request listed them.
    nlohmann::ordered_json functions = nlohmann::ordered_json::array();
    std::string only;       // tool_choice naming one function: its name ("" otherwise)
    bool required = false;  // tool_choice "required" (or naming a function)
    bool parallel = true;   // parallel_tool_calls
    ToolFormat format = ToolFormat::Generic;
};

// The request's "tools", "tool_choice" and "parallel_tool_calls"; nullopt without tools or
// with tool_choice "none". Throws Error for a malformed list, a tool without a name, twice
// the same name, or a tool_choice naming no listed tool.
std::optional<ChatTools> chat_tools_from_json(const nlohmann::ordered_json& request);

// OpenAI's older form of tools, rewritten in place into the newer one: "functions" ([{"name",
// "description", "parameters"}]) become "tools" with parallel_tool_calls off (one call per
// reply), "function_call" ("none", "auto" or {"name"}) becomes "tool_choice"; in "messages",
// an assistant's "function_call" becomes its one tool call and a "function" message (its
// "name" and "content") the result of that function's latest call. True when the request
// listed "functions". Throws Error for a malformed list, or both forms of one field.
bool chat_functions_to_tools(nlohmann::ordered_json& request);

// The text added to the system prompt: the tools and the reply format.
std::string chat_tools_instructions(const ChatTools& tools);

// The JSON schema every reply must match (the generation's grammar).
nlohmann::ordered_json chat_tools_schema(const ChatTools& tools);

// A tool list written flat, each {"type", "name", "description", <schema_key>} (a missing
// "type" is `default_type`), as chat completions' [{"type": "function", "function": {"name",
// "description", "parameters"}}]: Anthropic's custom tools, the Responses API's functions.
// A tool of another type (a provider's built-in tool) is refused, the message ending with
// `hint`; `shape` describes an entry for the error of a list that is not one.
nlohmann::ordered_json flat_tools_to_openai(const nlohmann::ordered_json& tools, const char* type,
                                            const char* default_type, const char* schema_key,
                                            const char* shape, const char* hint);

// A message's "content" as text: a string, or its {"type": "text", "text": ...} parts joined
// by newlines ("" when absent or null). Throws Error naming messages[index] for other parts.
std::string chat_message_text(const nlohmann::ordered_json& message, size_t index);
// The same for any "content" value; errors name `owner` (the object holding it).
std::string content_text(const nlohmann::ordered_json& content, const std::string& owner);

// The request's "messages" as chat messages (tool calls and results written as described
// above; "developer" is "system"). Throws Error naming the bad message.
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::ordered_json& messages);

// ---- Native formats (not Generic) ----

// The request's "messages" as a Jinja template's `messages`: OpenAI's shape kept for tool
// calls (arguments as objects) and tool results ("tool_call_id", and "name" from the call it
// answers); an assistant's "reasoning_content" kept; text parts joined; "developer" is
// "system". Throws Error as
// chat_messages_from_json.
nlohmann::ordered_json chat_messages_native(const nlohmann::ordered_json& messages);

// The same messages with each call's arguments as JSON text (as OpenAI sends them), for a
// template that writes them as text (DeepSeek R1's concatenates them to a string); the
// server renders with them when the objects make the template fail.
nlohmann::ordered_json chat_messages_arguments_as_text(nlohmann::ordered_json messages);

// The messages as `format`'s template needs them: Granite's gets each assistant's calls in
// its content (<|tool_call|>[...]), Phi-4-mini's too (closed by <|/tool_call|>); GLM 4.5's gets ""
// for a null content (which it would write as "None"); the others as they are.
nlohmann::ordered_json chat_messages_for_format(ToolFormat format, nlohmann::ordered_json messages);

// The same messages with a null "content" (an assistant's with tool calls) as "", for a
// template that needs every content to be a string (gpt-oss's).
nlohmann::ordered_json chat_messages_content_as_text(nlohmann::ordered_json messages);

// A conversation (chat_messages_native's) with the tools (chat_tools_native_list's) through a
// template in `format`, with the generation prompt: the messages as the format needs them,
// then retried with the arguments as text, with null contents as "", and both; throws the
// first error when every try fails.
std::string chat_tools_render(const JinjaTemplate& t, ToolFormat format,
                              const nlohmann::ordered_json& messages,
                              const nlohmann::ordered_json& tools, const ChatSpecialTexts& special,
                              const nlohmann::ordered_json& kwargs = nullptr);

// The tools as the template's `tools`: [{"type": "function", "function": {...}}].
nlohmann::ordered_json chat_tools_native_list(const ChatTools& tools);

// What keeps a reply to the format: a GBNF grammar and llama.cpp-style lazy triggers (a
// JSON list for "grammar_triggers"; empty: the grammar holds from the first token, as it
// does when a call is required).
struct ToolGrammar {
    std::string gbnf;
    nlohmann::json triggers = nlohmann::json::array();
    // Control tokens the reply's text shows (llama.cpp's preserved_tokens), so it is read back.
    std::vector<std::string> preserved;
};
// Whether a reply may start with reasoning (reasoning.h): None; Optional (the chat format
// thinks: a <think>...</think> block may come first); Open (the prompt opened the block: the
// reply starts inside it). With a required call the grammar then lets the reasoning come
// first, the calls after its "</think>" (Hermes and Llama3).
enum class ToolThinking { None, Optional, Open };
ToolGrammar chat_tools_grammar(const ChatTools& tools, const Tokenizer& tok,
                               ToolThinking thinking = ToolThinking::None);
// Text the prompt ends with, after the assistant's header: MistralNemo with a required call
// starts the reply with its "[TOOL_CALLS]" (the grammar then writes the list); else "".
std::string chat_tools_prompt_suffix(const ChatTools& tools);

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // a JSON object's compact text
};

// A reply read back: tool calls, or the answer text. A reply that is not the format (cut
// short by max_tokens, say) comes back whole as content.
struct ChatToolReply {
    std::string content;
    std::vector<ToolCall> calls;
};
// Ids are id_prefix + "_" + the call's position (MistralNemo: 9 letters and digits made from
// them, as its template demands). Generic: an answer cut short ({"response": "It is with no
// closing quote, max_tokens) gives the answer text so far. Native formats: the text before
// the calls is the content (Hermes, MistralV11, Qwen3Coder, DeepSeekR1, Granite, Glm45,
// KimiK2), and a reply that holds no readable call is all content; KimiK2 keeps the model's
// ids where they are functions.NAME:N and unique. `tools`: the request's (Qwen3Coder and
// Glm45 read a string parameter's value as text, not JSON).
ChatToolReply chat_tools_parse(ToolFormat format, const std::string& text,
                               const std::string& id_prefix, const ChatTools* tools = nullptr);

// A reply read while it is generated: whether it is (so far) an answer {"response": "...",
// and the answer's text whose characters are already known (escapes decoded; an escape or
// surrogate pair not yet whole waits). A stream shows an answer as it comes.
struct ToolAnswerPrefix {
    bool answer = false;  // the text so far begins an answer
    bool decided = true;  // false: too little text to tell yet
    std::string text;
};
ToolAnswerPrefix tool_answer_prefix(std::string_view reply);
// The same for any format: the content a stream may show of the reply so far (a prefix of
// what chat_tools_parse gives as content at the end). Hermes, Qwen3Coder and MistralV11 hold back
// text that may begin their call tag and trailing white space; Llama3 and MistralNemo show nothing
// of a reply that begins with "{" or "[", and all of any other.
ToolAnswerPrefix tool_stream_content(ToolFormat format, std::string_view reply);

// ---- Shared by the formats ----

// The JSON schema of one call: {"name": a listed tool's (the named one's with tool_choice),
// args_key: its parameters, "id"?: a short string when with_id}, tools' $defs at its root.
nlohmann::ordered_json chat_tools_call_schema(const ChatTools& tools, const std::string& args_key,
                                              bool with_id);
// chat_tools_parse for Generic.
ChatToolReply chat_tools_parse_generic(const std::string& text, const std::string& id_prefix);

// OpenAI's "tool_calls" list of a message (with "index" for a streamed delta).
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);

}  // namespace kvrun
