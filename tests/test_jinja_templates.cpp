// The Jinja interpreter on whole chat templates in the styles models ship (ChatML with tools,
// Llama 3, Mistral, Gemma, DeepSeek) and on the phi-3 vocabulary's real template, with
// expected outputs from Python's jinja2 (jinja_test_util.h); damaged copies of a template
// give an Error or a result, never a crash.
#include <string>

#include "gguf.h"
#include "jinja_test_util.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::test;

namespace {

const char* const kChatmlTools = R"tmpl({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou can call these functions. Their signatures, one per line:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nTo call one, reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
        {#- already printed above #}
    {%- elif message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- set fn = call.function if call.function is defined else call %}
            {{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
            {%- if fn.arguments is string %}
                {{- fn.arguments }}
            {%- else %}
                {{- fn.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)tmpl";
const Render kChatmlToolsRenders[] = {
    {R"json({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n"
     "Hi there<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
     "<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n",
     false},
    {R"json({"messages": [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "Weather in Zürich and the time?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}, {"type": "function", "function": {"name": "now", "arguments": "{}"}}]}, {"role": "tool", "content": "{\"temp\": 21.5}"}, {"role": "tool", "content": "12:00"}, {"role": "assistant", "content": "It is 21.5 °C and noon."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}}}]})json",
     "<|im_start|>system\nUse tools when needed.\n\n# Tools\n\nYou can call these functions"
     ". Their signatures, one per line:\n<tools>\n{\"type\": \"function\", \"function\": {\""
     "name\": \"get_weather\", \"description\": \"Current weather for a city\", \"parameter"
     "s\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"descr"
     "iption\": \"City name, e.g. Zürich\"}, \"unit\": {\"type\": \"string\", \"enum\": [\""
     "celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \""
     "function\": {\"name\": \"now\", \"description\": \"The time\", \"parameters\": {\"typ"
     "e\": \"object\", \"properties\": {}}}}\n</tools>\n\nTo call one, reply with <tool_cal"
     "l>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\n"
     "<|im_start|>user\nWeather in Zürich and the time?<|im_end|>\n"
     "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"cit"
     "y\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n"
     "<|im_start|>user\n<tool_response>\n{\"temp\": 21.5}\n</tool_response>\n"
     "<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
     "It is 21.5 °C and noon.<|im_end|>\n<|im_start|>assistant\n",
     false},
    {R"json({"messages": [{"role": "user", "content": "  What is 2+2?  "}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks — merci ✓"}], "add_generation_prompt": false, "bos_token": "<s>", "eos_token": "</s>", "tools": []})json",
     "<|im_start|>user\n  What is 2+2?  <|im_end|>\n<|im_start|>assistant\n"
     "4<|im_end|>\n<|im_start|>user\nThanks — merci ✓<|im_end|>\n",
     false},
    {R"json({"messages": [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "Weather in Zürich and the time?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}, {"type": "function", "function": {"name": "now", "arguments": "{}"}}]}, {"role": "tool", "content": "{\"temp\": 21.5}"}, {"role": "tool", "content": "12:00"}, {"role": "assistant", "content": "It is 21.5 °C and noon."}], "add_generation_prompt": false, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<|im_start|>system\nUse tools when needed.<|im_end|>\n<|im_start|>user\n"
     "Weather in Zürich and the time?<|im_end|>\n<|im_start|>assistant\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit"
     "\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
     "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21.5}\n"
     "</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
     "<|im_start|>assistant\nIt is 21.5 °C and noon.<|im_end|>\n",
     false},
};

const char* const kLlama3 = R"tmpl({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "1 Jan 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and tools|length > 0 %}
    {{- "You have access to the following functions:\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role in ['user', 'system', 'assistant'] %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- elif message.role in ["tool", "ipython"] %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable and message.content is not string %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)tmpl";
const Render kLlama3Renders[] = {
    {R"json({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": null})json",
     "<s><|start_header_id|>system<|end_header_id|>\n\nToday Date: 1 Jan 2024\n"
     "\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\nHello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\nTell me a joke.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n",
     false},
    {R"json({"messages": [{"role": "user", "content": "  What is 2+2?  "}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks — merci ✓"}], "add_generation_prompt": false, "bos_token": "<s>", "eos_token": "</s>", "date_string": "26 Jul 2024"})json",
     "<s><|start_header_id|>system<|end_header_id|>\n\nToday Date: 26 Jul 2024\n"
     "\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start"
     "_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>user<|end_hea"
     "der_id|>\n\nThanks — merci ✓<|eot_id|>",
     false},
    {R"json({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]})json",
     "<s><|start_header_id|>system<|end_header_id|>\n\nToday Date: 1 Jan 2024\n"
     "\nYou have access to the following functions:\n\n{\n    \"type\": \"function\",\n"
     "    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"C"
     "urrent weather for a city\",\n        \"parameters\": {\n            \"type\": \"obje"
     "ct\",\n            \"properties\": {\n                \"city\": {\n"
     "                    \"type\": \"string\",\n                    \"description\": \"Cit"
     "y name, e.g. Zürich\"\n                },\n                \"unit\": {\n"
     "                    \"type\": \"string\",\n                    \"enum\": [\n"
     "                        \"celsius\",\n                        \"fahrenheit\"\n"
     "                    ]\n                }\n            },\n            \"required\": ["
     "\n                \"city\"\n            ]\n        }\n    }\n"
     "}\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\nHello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
     "\nTell me a joke.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n",
     false},
    {R"json({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": {"ok": true, "n": [1, 2]}}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": null})json",
     "<s><|start_header_id|>system<|end_header_id|>\n\nToday Date: 1 Jan 2024\n"
     "\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|><|start_header_id|"
     ">ipython<|end_header_id|>\n\n{\"ok\": true, \"n\": [1, 2]}<|eot_id|><|start_header_id"
     "|>assistant<|end_header_id|>\n\n",
     false},
};

const char* const kMistral = R"tmpl({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, roles must alternate user/assistant/user/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- else %}
        {{- raise_exception('Unknown role: ' ~ message['role']) }}
    {%- endif %}
{%- endfor %}
)tmpl";
const Render kMistralRenders[] = {
    {R"json({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s>[INST] Hi there[/INST] Hello! How can I help?</s>[INST] You are terse.\n"
     "\nTell me a joke.[/INST]",
     false},
    {R"json({"messages": [{"role": "user", "content": "  What is 2+2?  "}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks — merci ✓"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s>[INST]   What is 2+2?  [/INST] 4</s>[INST] Thanks — merci ✓[/INST]", false},
    {R"json({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "After the optional system message, roles must alternate user/assistant/user/...", true},
    {R"json({"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "Unknown role: robot", true},
};

const char* const kGemma = R"tmpl({{ bos_token }}
{%- set ns = namespace(system='', first_user=true) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'system' -%}
        {%- set ns.system = message['content'] | trim + '\n\n' -%}
    {%- else -%}
        {%- if message['role'] == 'assistant' -%}
            {%- set role = 'model' -%}
        {%- else -%}
            {%- set role = message['role'] -%}
        {%- endif -%}
        {%- if role == 'user' and ns.first_user -%}
            {%- set prefix = ns.system -%}
            {%- set ns.first_user = false -%}
        {%- else -%}
            {%- set prefix = '' -%}
        {%- endif -%}
        {%- if message['content'] is string -%}
            {%- set text = message['content'] | trim -%}
        {%- else -%}
            {%- set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\n') -%}
        {%- endif -%}
        {{ '<start_of_turn>' + role + '\n' + prefix + text + '<end_of_turn>\n' }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
)tmpl";
const Render kGemmaRenders[] = {
    {R"json({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
     "<start_of_turn>model\nHello! How can I help?<end_of_turn>\n<start_of_turn>user\n"
     "Tell me a joke.<end_of_turn>\n<start_of_turn>model\n",
     false},
    {R"json({"messages": [{"role": "user", "content": "  What is 2+2?  "}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks — merci ✓"}], "add_generation_prompt": false, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
     "4<end_of_turn>\n<start_of_turn>user\nThanks — merci ✓<end_of_turn>\n",
     false},
    {R"json({"messages": [{"role": "system", "content": " Sys prompt "}, {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image"}, {"type": "text", "text": "what is it?"}]}, {"role": "assistant", "content": "A cat."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s><start_of_turn>user\nSys prompt\n\nLook:\nwhat is it?<end_of_turn>\n"
     "<start_of_turn>model\nA cat.<end_of_turn>\n<start_of_turn>model\n",
     false},
};

const char* const kDeepseek =
    R"tmpl({% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{%- set ns = namespace(system_prompt='', is_tool=false, is_first=false, is_output_first=true) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if ns.system_prompt %}{% set ns.system_prompt = ns.system_prompt + '\n\n' %}{% endif %}
        {%- set ns.system_prompt = ns.system_prompt + message['content'] %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}{{ ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.is_tool = false -%}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}
        {%- set ns.is_tool = false -%}
        {%- set ns.is_first = true -%}
        {{- '<｜Assistant｜>' }}
        {%- if message['content'] %}{{ message['content'] }}{% endif %}
        {{- '<｜tool▁calls▁begin｜>' }}
        {%- for tool in message['tool_calls'] %}
            {{- '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n```json\n' + tool['function']['arguments'] | tojson + '\n```<｜tool▁call▁end｜>' }}
            {%- if not loop.last %}{{ '\n' }}{% endif %}
        {%- endfor %}
        {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
    {%- elif message['role'] == 'assistant' %}
        {%- set content = message['content'] %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1] %}
        {%- endif %}
        {%- if ns.is_tool %}
            {{- '<｜tool▁outputs▁end｜>' + content + '<｜end▁of▁sentence｜>' }}
            {%- set ns.is_tool = false -%}
        {%- else %}
            {{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
        {%- endif %}
    {%- elif message['role'] == 'tool' %}
        {%- set ns.is_tool = true -%}
        {%- if ns.is_output_first %}
            {{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
            {%- set ns.is_output_first = false %}
        {%- else %}
            {{- '\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
        {%- endif %}
    {%- endif %}
{%- endfor -%}
{% if ns.is_tool %}{{ '<｜tool▁outputs▁end｜>' }}{% endif %}
{% if add_generation_prompt and not ns.is_tool %}{{ '<｜Assistant｜><think>\n' }}{% endif %})tmpl";
const Render kDeepseekRenders[] = {
    {R"json({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s>You are terse.<｜User｜>Hi there<｜Assistant｜>Hello! How can I help?<｜end▁of▁sentence"
     "｜><｜User｜>Tell me a joke.<｜Assistant｜><think>\n",
     false},
    {R"json({"messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "<think>\nlet me think\n</think>\n\nBecause."}, {"role": "user", "content": "Ok"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s><｜User｜>Why?<｜Assistant｜>\n\nBecause.<｜end▁of▁sentence｜><｜User｜>Ok<｜Assistant｜><"
     "th"
     "ink>\n",
     false},
    {R"json({"messages": [{"role": "user", "content": "time?"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}}]}, {"role": "tool", "content": "12:00"}, {"role": "tool", "content": "ok"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s><｜User｜>time?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<"
     "｜tool▁se"
     "p｜>now\n```json\n\"{\\\"tz\\\": \\\"UTC\\\"}\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜"
     "><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>12:00<｜tool▁output▁end"
     "｜>\n<｜tool▁output▁begin｜>ok<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
     false},
    {R"json({"messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "<think>\nlet me think\n</think>\n\nBecause."}, {"role": "user", "content": "Ok"}], "add_generation_prompt": false, "bos_token": "<s>", "eos_token": "</s>"})json",
     "<s><｜User｜>Why?<｜Assistant｜>\n\nBecause.<｜end▁of▁sentence｜><｜User｜>Ok", false},
};

const char* const kToolConversation =
    R"json({"messages": [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "Weather in Zürich and the time?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}, {"type": "function", "function": {"name": "now", "arguments": "{}"}}]}, {"role": "tool", "content": "{\"temp\": 21.5}"}, {"role": "tool", "content": "12:00"}, {"role": "assistant", "content": "It is 21.5 °C and noon."}], "tools": [], "add_generation_prompt": true})json";

}  // namespace

TEST_CASE("jinja: a chatml_tools-style chat template") {
    check_renders(kChatmlTools, kChatmlToolsRenders);
}

TEST_CASE("jinja: a llama3-style chat template") {
    check_renders(kLlama3, kLlama3Renders);
}

TEST_CASE("jinja: a mistral-style chat template") {
    check_renders(kMistral, kMistralRenders);
}

TEST_CASE("jinja: a gemma-style chat template") {
    check_renders(kGemma, kGemmaRenders);
}

TEST_CASE("jinja: a deepseek-style chat template") {
    check_renders(kDeepseek, kDeepseekRenders);
}

TEST_CASE("jinja: damaged templates give an Error or a result, never a crash") {
    // Every prefix of a real-style template, and random byte edits of it (fixed seed).
    const std::string src = kChatmlTools;
    json ctx = json::parse(kToolConversation);
    size_t errors = 0, rendered = 0;
    auto attempt = [&](const std::string& t) {
        try {
            JinjaTemplate::parse(t).render(ctx);
            ++rendered;
        } catch (const Error&) {
            ++errors;
        }
    };
    for (size_t n = 0; n <= src.size(); n += 3) attempt(src.substr(0, n));
    uint64_t state = 12345;
    auto rnd = [&](uint64_t n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return (state >> 33) % n;
    };
    const char alphabet[] = "{}%#-+()[]'\"|.,:=~ \n\tabcxyz019_";
    for (int k = 0; k < 3000; ++k) {
        std::string t = src;
        for (int edits = 1 + int(rnd(4)); edits > 0; --edits) {
            size_t at = rnd(t.size());
            switch (rnd(3)) {
                case 0:
                    t[at] = alphabet[rnd(sizeof alphabet - 1)];
                    break;
                case 1:
                    t.erase(at, 1 + rnd(8));
                    break;
                default:
                    t.insert(at, 1, alphabet[rnd(sizeof alphabet - 1)]);
            }
        }
        attempt(t);
    }
    MESSAGE(rendered << " rendered, " << errors << " errors");
    CHECK(rendered + errors > 3000);
}

TEST_CASE("jinja: the phi-3 vocab's own chat template") {
    auto path = test::shared_path("vocab/ggml-vocab-phi-3.gguf");
    if (path.empty()) return;
    if (!std::filesystem::exists(path)) {
        MESSAGE("SKIP: missing " << path.string());
        return;
    }
    GgufFile gguf = GgufFile::open(path.string());
    std::string src = gguf.get_string_or("tokenizer.chat_template", "");
    REQUIRE(!src.empty());
    json ctx = json::parse(R"({"bos_token": "<s>", "eos_token": "<|endoftext|>",
        "add_generation_prompt": true, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})");
    // jinja2's output (phi-3's template prints no system message).
    CHECK(JinjaTemplate::parse(src).render(ctx) ==
          "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n"
          "<|assistant|>\n");
}
