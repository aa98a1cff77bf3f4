// Shared by the native tool formats' files (server_tool_formats.cpp: detection, messages and
// rendering; server_tool_grammar.cpp: the grammars; server_tool_parse.cpp: reading replies).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "modes/server_tools.h"

namespace kvrun::tool_detail {

inline constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
inline constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kPythonTag = "<|python_tag|>";
inline constexpr std::string_view kMistralArgs = "[ARGS]", kMistralCallId = "[CALL_ID]";
inline constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
inline constexpr std::string_view kXmlFunction = "<function=", kXmlParameter = "<parameter=";
inline constexpr std::string_view kXmlParameterEnd = "</parameter>",
                                  kXmlFunctionEnd = "</function>";
// DeepSeek R1's tool tokens.
inline constexpr std::string_view kR1CallsBegin = "<｜tool▁calls▁begin｜>",
                                  kR1CallsEnd = "<｜tool▁calls▁end｜>",
                                  kR1CallBegin = "<｜tool▁call▁begin｜>",
                                  kR1CallEnd = "<｜tool▁call▁end｜>", kR1Sep = "<｜tool▁sep｜>";
// gpt-oss's harmony tags.
inline constexpr std::string_view kHarmonyChannel = "<|channel|>", kHarmonyFunctions = "functions.";
inline constexpr std::string_view kHarmonyEnd = "<|end|>";
// IBM Granite 3.x's call tag (also Phi-4-mini's, which closes its calls).
inline constexpr std::string_view kGraniteCall = "<|tool_call|>";
// FireFunction v2's marker before its list of calls.
inline constexpr std::string_view kFunctools = "functools[";
// Functionary v3.2: each call (and the text) follows ">>>"; the text's part is named "all".
inline constexpr std::string_view kV32Next = ">>>", kV32All = "all\n";
// Phi-4-mini's tags: the end of its calls, and the tool list in the system message.
inline constexpr std::string_view kPhi4CallEnd = "<|/tool_call|>", kPhi4Tools = "<|tool|>",
                                  kPhi4ToolsEnd = "<|/tool|>";
// GLM 4.5's argument tags (its calls are inside Hermes's <tool_call> tags).
inline constexpr std::string_view kGlmKey = "<arg_key>", kGlmKeyEnd = "</arg_key>";
inline constexpr std::string_view kGlmValue = "<arg_value>", kGlmValueEnd = "</arg_value>";
// Command R7B's tags: the tool plan (its reasoning), the calls, the answer.
inline constexpr std::string_view kR7bPlan = "<|START_THINKING|>", kR7bPlanEnd = "<|END_THINKING|>",
                                  kR7bAction = "<|START_ACTION|>", kR7bActionEnd = "<|END_ACTION|>",
                                  kR7bResponse = "<|START_RESPONSE|>",
                                  kR7bResponseEnd = "<|END_RESPONSE|>";
// Kimi K2's tool tokens.
inline constexpr std::string_view kKimiSection = "<|tool_calls_section_begin|>",
                                  kKimiSectionEnd = "<|tool_calls_section_end|>",
                                  kKimiCall = "<|tool_call_begin|>",
                                  kKimiArgs = "<|tool_call_argument_begin|>",
                                  kKimiCallEnd = "<|tool_call_end|>";

// Llama 3.1's built-in tools: a listed tool named wolfram_alpha, brave_search or web_search
// is called as <|python_tag|>NAME.call(ARG="VALUE", ...), one named python or
// code_interpreter (llama3_code_tool) as <|python_tag|> and the code; the template is told
// their names in "builtin_tools".
bool llama3_builtin(std::string_view name);
bool llama3_code_tool(std::string_view name);

// A parameter's schema in the tools' call schema, or null.
const nlohmann::ordered_json* parameter_schema(const ChatTools* tools, const std::string& fn,
                                               const std::string& p);
// A string parameter's value is its text as written; others are JSON where they parse.
bool string_typed(const nlohmann::ordered_json* schema);

}  // namespace kvrun::tool_detail
