// Shared by the tool-format tests: chat templates written for them in the styles of six
// model families' tool syntaxes (not those models' own texts), and ChatTools for the two
// test tools (tool_test_util.h) in a given format.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "modes/server_tools.h"
#include "tool_test_util.h"

namespace kvrun::test {

// The templates, in the styles of Hermes/Qwen, Llama 3.1, Mistral Nemo, Mistral Small 3.2,
// Qwen3-Coder and DeepSeek R1.
inline const char* const kHermes = R"tmpl({%- if tools %}<|im_start|>system
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

inline const char* const kLlama3 = R"tmpl(<|start_header_id|>system<|end_header_id|>

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

// In the style of Llama 3.1's own template: built-in tools (builtin_tools) called as
// <|python_tag|>NAME.call(ARG="VALUE"), code_interpreter left out of the "Tools:" line, other
// calls as JSON; a reply in ipython mode ends with <|eom_id|>.
inline const char* const kLlama31 = R"tmpl({{- bos_token }}
{%- if messages[0].role == 'system' %}{% set system_message = messages[0].content | trim %}{% set messages = messages[1:] %}{% else %}{% set system_message = "" %}{% endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools %}{{- "Environment: ipython\n" }}{% endif %}
{%- if builtin_tools is defined %}{{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n" }}{% endif %}
{%- if tools %}{{- "To call a function, reply with {\"name\": <name>, \"parameters\": <arguments>}. The functions:\n" }}{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}
{{- system_message }}<|eot_id|>
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{%- set tool_call = message.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>

{% if builtin_tools is defined and tool_call.name in builtin_tools -%}
<|python_tag|>{{ tool_call.name }}.call({% for name, value in tool_call.arguments | items %}{{ name }}="{{ value }}"{% if not loop.last %}, {% endif %}{% endfor %})
{%- else -%}
{"name": "{{ tool_call.name }}", "parameters": {{ tool_call.arguments | tojson }}}
{%- endif %}{% if builtin_tools is defined %}<|eom_id|>{% else %}<|eot_id|>{% endif %}
{%- elif message.role == 'tool' or message.role == 'ipython' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content | trim }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}
)tmpl";

inline const char* const kMistral = R"tmpl({%- for message in messages %}
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

inline const char* const kMistralV11 = R"tmpl({%- for message in messages %}
{%- if message.role == 'system' %}[SYSTEM_PROMPT]{{ message.content }}[/SYSTEM_PROMPT]
{%- elif message.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}
{%- for c in message.tool_calls %}[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}{{ eos_token }}
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{{ message.content }}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}
)tmpl";

inline const char* const kQwen3Coder =
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
inline const char* const kDeepSeekR1 =
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

// In the style of DeepSeek V3.1's template: the name, the separator and the arguments as
// text, no type and no ```json block; the prompt ends in </think> unless `thinking`.
inline const char* const kDeepSeekV31 =
    R"tmpl({%- if thinking is not defined %}{% set thinking = false %}{% endif %}
{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}
{%- if tools %}

## Tools
{% for t in tools %}
### {{ t.function.name }}
Description: {{ t.function.description }}
Parameters: {{ t.function.parameters | tojson }}
{% endfor %}
Call tools as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜><｜tool▁calls▁end｜>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<｜User｜>{{ m.content }}
{%- elif m.role == 'assistant' and m.tool_calls %}<｜Assistant｜></think><｜tool▁calls▁begin｜>
{%- for c in m.tool_calls %}{{ '<｜tool▁call▁begin｜>' + c.function.name + '<｜tool▁sep｜>' + c.function.arguments + '<｜tool▁call▁end｜>' }}{% endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
{%- elif m.role == 'assistant' %}<｜Assistant｜></think>{{ m.content }}<｜end▁of▁sentence｜>
{%- elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}
)tmpl";

// In the style of gpt-oss's harmony template: the tools in a developer message, a call as a
// commentary message to its function, a result from the function; earlier replies without their
// <|channel|>analysis text (as the real template drops it).
inline const char* const kHarmony =
    R"tmpl({#- earlier replies' <|channel|>analysis messages are not written back #}
<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>
{%- if tools %}<|start|>developer<|message|># Tools
{% for t in tools %}type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{% endfor %}<|end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' and m.tool_calls %}{% set c = m.tool_calls[0].function %}<|start|>assistant to=functions.{{ c.name }}<|channel|>commentary json<|message|>{{ c.arguments | tojson }}<|call|>
{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'tool' %}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %})tmpl";

// In the style of IBM Granite 3.x's template: the tools as JSON in their own role, every
// message's content alone (the server writes a call there as <|tool_call|>[...]).
inline const char* const kGranite =
    R"tmpl({%- if tools %}<|start_of_role|>system<|end_of_role|>When a tool is needed, answer only with <|tool_call|> and a JSON list of the calls.<|end_of_text|>
<|start_of_role|>available_tools<|end_of_role|>{{ tools | tojson(indent=4) }}<|end_of_text|>
{% endif %}
{%- for m in messages %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}<|end_of_text|>
{% endfor %}
{%- if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %})tmpl";

// In the style of GLM 4.5's template: a call as <tool_call>name and its arguments as key and
// value tags (a string as it is, other values as JSON), results in observation turns.
inline const char* const kGlm45 =
    R"tmpl([gMASK]<sop>{% if tools %}<|system|>
Call a tool as <tool_call>NAME
<arg_key>KEY</arg_key>
<arg_value>VALUE</arg_value>
</tool_call>
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|user|>
{{ m.content }}
{%- elif m.role == 'assistant' %}<|assistant|>
{{ m.content }}
{%- for c in m.tool_calls or [] %}
<tool_call>{{ c.function.name }}
{%- for k, v in c.function.arguments.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v if v is string else v | tojson }}</arg_value>
{%- endfor %}
</tool_call>
{%- endfor %}
{%- elif m.role == 'tool' %}<|observation|>
<tool_response>
{{ m.content }}
</tool_response>
{%- else %}<|system|>
{{ m.content }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %})tmpl";

// In the style of Kimi K2's template: the tools declared as JSON, a call under its id
// (functions.NAME:N) between Kimi's section and call tags, a result under the same id.
inline const char* const kKimiK2 =
    R"tmpl({%- if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|im_user|>user<|im_middle|>
{%- elif m.role == 'assistant' %}<|im_assistant|>assistant<|im_middle|>
{%- else %}<|im_system|>{{ m.role }}<|im_middle|>{% endif %}
{%- if m.role == 'tool' %}## Return of {{ m.tool_call_id }}
{% endif %}
{{- m.content or '' }}
{%- if m.tool_calls %}<|tool_calls_section_begin|>
{%- for c in m.tool_calls %}<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>
{%- endif %}<|im_end|>
{%- endfor %}
{%- if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %})tmpl";

// In the style of Command R7B's template: the tools as JSON in the system turn, an earlier
// reply's plan and calls between its thinking and action tags, results in a system turn.
inline const char* const kCommandR7B =
    R"tmpl(<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Plan, then call tools as <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "NAME", "parameters": {}}]<|END_ACTION|>, or answer as <|START_RESPONSE|>TEXT<|END_RESPONSE|>.
{%- if tools %}
Tools:
{%- for t in tools %}
{{ t.function | tojson }}
{%- endfor %}{% endif %}<|END_OF_TURN_TOKEN|>
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>
{%- if m.tool_calls %}<|START_THINKING|>{{ m.tool_plan or '' }}<|END_THINKING|><|START_ACTION|>[
{%- for c in m.tool_calls %}{"tool_call_id": "{{ loop.index0 }}", "tool_name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}{% if not loop.last %}, {% endif %}{% endfor %}]<|END_ACTION|>
{%- else %}<|START_RESPONSE|>{{ m.content }}<|END_RESPONSE|>{% endif %}<|END_OF_TURN_TOKEN|>
{%- elif m.role == 'tool' %}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>{{ m.content }}<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>
{%- else %}<|START_OF_TURN_TOKEN|>{% if m.role == 'user' %}<|USER_TOKEN|>{% else %}<|SYSTEM_TOKEN|>{% endif %}{{ m.content }}<|END_OF_TURN_TOKEN|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %})tmpl";

// In the style of Phi-4-mini's template: the tools only from a system message's "tools" text,
// between <|tool|> and <|/tool|>; every message's content alone (the server writes a call
// there as <|tool_call|>[...]<|/tool_call|>), each turn tagged with its role.
inline const char* const kPhi4Mini =
    R"tmpl({% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}
{%- if m['role'] == 'system' and 'tools' in m and m['tools'] is not none %}<|tool|>{{ m['tools'] }}<|/tool|>{% endif %}<|end|>
{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% else %}{{ eos_token }}{% endif %})tmpl";

// In the style of MeetKai Functionary v3.1's template (Llama 3.1's headers): the functions as
// JSON in the system turn, a call as <function=NAME> and its arguments added as text (objects
// fail, as there), a "python" call after <|python_tag|>, results in ipython turns.
inline const char* const kFunctionaryV31 =
    R"tmpl(<|start_header_id|>system<|end_header_id|>

{% if tools %}Functions:
{% for t in tools %}{{ t.function | tojson }}
{% endfor %}Call one as <function=NAME>{"ARG": VALUE}</function>.
{% endif %}<|eot_id|>
{%- for m in messages %}
{%- if m.role == 'tool' %}{{ '<|start_header_id|>ipython<|end_header_id|>\n\n' + m.content + '<|eot_id|>' }}
{%- elif m.role == 'assistant' %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' + (m.content or '') }}
{%- for c in m.tool_calls or [] %}
{%- if c.function.name == 'python' %}{{ '<|python_tag|>' + c.function.arguments }}
{%- else %}{{ '<function=' + c.function.name + '>' + c.function.arguments + '</function>' }}{% endif %}
{%- endfor %}{{ '<|eom_id|>' if m.tool_calls else '<|eot_id|>' }}
{%- else %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + m.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})tmpl";

// In the style of FireFunction v2's template (Llama 3's headers): the system prompt ends with
// the "functions" and "datetime" the caller gives, calls follow the content as
// functools[...] with their arguments added as text (objects fail, as there).
inline const char* const kFireFunctionV2 =
    R"tmpl({%- set suffix = 'Call functions as functools[{"name": NAME, "arguments": ARGS}, ...].\nFunctions:\n' + functions + '\nToday is ' + datetime + '.' -%}
{%- for m in messages -%}
{%- if loop.first -%}
{{ '<|start_header_id|>system<|end_header_id|>\n\n' + (m.content + '\n' if m.role == 'system' else 'You can call functions.\n') + suffix + '<|eot_id|>' }}
{%- endif -%}
{%- if not (loop.first and m.role == 'system') -%}
{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + (m.content or '') }}
{%- if m.tool_calls -%}
{%- set ns = namespace(calls=[]) -%}
{%- for c in m.tool_calls -%}
{%- set ns.calls = ns.calls + ['{"name": "' + c.function.name + '", "arguments": ' + c.function.arguments + '}'] -%}
{%- endfor -%}
{{ ' functools[' + ns.calls | join(', ') + ']' }}
{%- endif -%}
{{ '<|eot_id|>' }}
{%- endif -%}
{%- endfor -%}
{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }})tmpl";

// In the style of MeetKai Functionary v3.2's template (Llama 3's headers): the functions as
// TypeScript types in a system turn, every assistant part after ">>>" ("all" for the text, a
// call as NAME and its arguments added as text), results in tool turns, and the prompt ending
// with ">>>".
inline const char* const kFunctionaryV32 =
    R"tmpl({% if tools %}<|start_header_id|>system<|end_header_id|>

// Supported function definitions that should be called when necessary.
namespace functions {
{% for t in tools %}// {{ t.function.description }}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{% endfor %}} // namespace functions<|eot_id|>
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}{{ '<|start_header_id|>tool<|end_header_id|>\n\n' + m.content + '<|eot_id|>' }}
{%- elif m.role == 'assistant' %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- if m.content %}{{ '>>>all\n' + m.content }}{% endif %}
{%- for c in m.tool_calls or [] %}{{ '>>>' + c.function.name + '\n' + c.function.arguments }}{% endfor %}
{{- '<|eot_id|>' }}
{%- else %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + m.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n>>>' }}{% endif %})tmpl";

// The conversation of the rendering tests: a call with its id, its result, a new question.
inline const char* const kHistory = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "2+3?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123", "type": "function",
    "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
  {"role": "tool", "tool_call_id": "abcDEF123", "content": "5"},
  {"role": "user", "content": "And 4+4?"}])";

inline ChatTools tools_for(ToolFormat format, const std::string& choice = "auto",
                           bool parallel = true) {
    nlohmann::ordered_json req = {
        {"tools", weather_and_add()}, {"tool_choice", choice}, {"parallel_tool_calls", parallel}};
    ChatTools t = *chat_tools_from_json(req);
    t.format = format;
    return t;
}

}  // namespace kvrun::test
