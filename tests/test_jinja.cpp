// The Jinja chat-template interpreter (src/jinja.h), feature by feature: tables of small
// templates whose expected outputs come from Python's jinja2 (jinja_test_util.h), the
// context's variables, syntax and runtime errors, and hostile templates that must stop with
// an Error. Whole chat templates: test_jinja_templates.cpp.
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>

#include "jinja_test_util.h"

using namespace kvrun;
using namespace kvrun::test;

namespace {

// ---- Cases and expected outputs (from jinja2) ----

const char* const kCtxWhitespace = R"json({"s": "Hello", "items": ["a", "b"], "flag": true})json";
const Case kWhitespace[] = {
    {"{% for x in items %}\n{{ x }}\n{% endfor %}\n", "a\nb\n"},
    {"  {% for x in items %}\n    {{ x }}\n  {% endfor %}\nend", "    a\n    b\nend"},
    {"a\n{%- if true %}\nb\n{% endif -%}\n\nc", "ab\nc"},
    {"a   {{- s -}}   b", "aHellob"},
    {"{{ s }}\n{{ s }}\n", "Hello\nHello"},
    {"{% if flag %}a{% endif %}\n{% if flag %}b{% endif %}\n", "ab"},
    {"x {% if flag %}\ny{% endif %} z", "x y z"},
    {"  {{ s }}  {% if flag %}  q  {% endif %}  ", "  Hello    q    "},
    {"line1\n\t{% set x = 1 %}\nline2{{ x }}", "line1\nline21"},
    {"a\n{#- comment -#}\nb\n  {# c2 #}  \nd", "ab\n  \nd"},
    {"a\n  {# c #}\nb", "a\nb"},
    {"{# a #}\n{# b -#}\n  c", "c"},
    {"a\n  {%+ if true %}x{% endif +%}\nb", "a\n  x\nb"},
    {"\n   {%+ if true %}a{% endif %}", "\n   a"},
    {"a {%- if true -%} b {%- endif -%} c", "abc"},
    {"{%- if true -%}\n\n  a  \n\n{%- endif -%}\n", "a"},
    {"a\n\n{% if false %}\nx\n{% else %}\ny\n{% endif %}\n\nb", "a\n\ny\n\nb"},
    {"{% if true %}\n\n{% endif %}|", "\n|"},
    {"{{ s }}\n{% for i in [1] %}\n\n{% endfor %}x", "Hello\n\nx"},
    {"{{ 'a' }}\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", "a\nb\n"},
    {"x\n", "x"},
    {"x\n\n", "x\n"},
    {"{% if true %}\n{% endif %}\n", ""},
    {"{% raw %}\n  {% if %}{{ }}\n{% endraw %}\nafter", "\n  {% if %}{{ }}\nafter"},
    {"   {%- raw %} x {% endraw -%}   y", " x y"},
    {"a\n{% raw %}{{ x }}{% endraw %}\nb", "a\n{{ x }}b"},
    {"a\n  {%- raw -%}  {{ x }}  {%- endraw -%}  \nb", "a{{ x }}b"},
    {"{% raw %}x\n  {% endraw %}y", "x\ny"},
    {"{% raw -%}\n  x{% endraw %}", "x"},
    {"{{ {'a': {'b': 1}} }}", "{'a': {'b': 1}}"},
    {"{{ '}}' }}{{ \"%}\" }}", "}}%}"},
    {"{% macro m(x) %}\n  <{{ x }}>\n{% endmacro %}\n{{ m(1) }}|{{ m(2) }}", "  <1>\n|  <2>\n"},
    {"{% filter upper %}\n  hello {{ s }}\n{% endfilter %}", "  HELLO HELLO\n"},
    {"{% generation %}gen {{ s }}{% endgeneration %}", "gen Hello"},
};

const char* const kCtxLoopsAndScoping =
    R"json({"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], "d": {"b": 1, "a": 2}, "l": [3, 1, 2]})json";
const Case kLoopsAndScoping[] = {
    {"{% for x in [1, 2] %}{% macro m() %}<{{ x }}>{% endmacro %}{{ m() }}{% endfor %}", "<1><2>"},
    {"{% for x in [1, 2] %}{% set x = x * 10 %}{{ x }}{% endfor %}", "1020"},
    {"{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}", "2"},
    {"{% macro m() %}{% set y = 1 %}{% endmacro %}{{ m() }}[{{ y }}]", "[]"},
    {"{% set x = 5 %}{% for i in [1] %}{{ x }}{% set x = 6 %}{{ x }}{% endfor %}{{ x }}", "565"},
    {"{% for i in [1] %}{{ loop.length }}{% for j in [1, 2] %}{{ loop.length }}{% endfor %}"
     "{{ loop.length }}{% endfor %}",
     "1221"},
    {"{% set a = [1, 2] %}{% for x in a %}{% set a = [] %}{{ x }}{% endfor %}{{ a }}", "12[1, 2]"},
    {"{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", "2"},
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", "21"},
    {"{% set x = 0 %}{% for i in range(3) %}{% if i == 0 %}{% set y = 1 %}{% endif %}[{{ y "
     "}}]{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
     "[1]1[]1[]10"},
    {"{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'user' %}"
     "{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}",
     "True"},
    {"{% set ns = namespace(a=1, l=[]) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{%"
     " endfor %}{{ ns.a }}{{ ns }}",
     "4<Namespace {'a': 4, 'l': []}>"},
    {"{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items +"
     " [i] %}{% endfor %}{{ ns.items }}",
     "[0, 1, 2]"},
    {"{% set ns = namespace() %}{% set ns.x = 5 %}{{ ns.x }}[{{ ns.y }}]", "5[]"},
    {"{{ namespace(a=1).a }}{{ dict(a=1, b=2) }}{{ namespace(d).b }}", "1{'a': 1, 'b': 2}1"},
    {"{% for i in [1,2] %}{% for j in [3] %}{{ i }}{{ j }}{% endfor %}{% endfor %}[{{ i }}]",
     "1323[]"},
    {"{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.re"
     "vindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
     "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
    {"{% for a in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", "-2;1-3;2-;"},
    {"{% for i in range(3) %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{%"
     " endfor %}",
     "FalseTrueTrueTrueTrueFalse"},
    {"{% for i in range(4) %}{{ loop.cycle('a','b') }}{% endfor %}", "abab"},
    {"{% for x in [] %}a{% else %}empty{% endfor %}{% for x in [1] %}a{% else %}empty{% end"
     "for %}",
     "emptya"},
    {"{% for x in undefined_var %}{{ x }}{% else %}none{% endfor %}", "none"},
    {"{% for i in [1,2,3] if i > 1 %}{{ loop.index }}/{{ loop.length }} {% else %}none{% en"
     "dfor %}",
     "1/2 2/2 "},
    {"{% for i in [1,2,3] if i > 5 %}x{% else %}none{% endfor %}", "none"},
    {"{% for i in range(10) if i is odd %}{% if loop.index > 2 %}{% break %}{% endif %}{{ i"
     " }}{% endfor %}",
     "13"},
    {"{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% brea"
     "k %}{% endif %}{{ i }}{% endfor %}",
     "02"},
    {"{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.ind"
     "ex }}{% endfor %}",
     "121122"},
    {"{% for i in range(2) %}{% set outer = loop %}{% for j in range(2) %}{{ outer.index }}"
     "{{ loop.index }} {% endfor %}{% endfor %}",
     "11 12 21 22 "},
    {"{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}", "a2b1"},
    {"{% for k in d %}{{ k }}{% endfor %}{% for k, v in d.items() %}{{ v }}{% endfor %}", "ba12"},
    {"{% for c in 'ab' %}{{ c }}{% endfor %}{% for (a, b) in [[1, 2]] %}{{ a }}{{ b }}{% en"
     "dfor %}",
     "ab12"},
    {"{% for a, b in [[1,2],[3,4]] %}{{ a+b }}{% endfor %}{% set p, q = 1, 2 %}{{ p }}{{ q "
     "}}{% set r = 1, 2 %}{{ r }}",
     "3712(1, 2)"},
    {"{% for a in [[1,2],[3,4]] %}{% set x, y = a %}{{ x*y }}{% endfor %}", "212"},
    {"{% for m in messages[1:] %}{{ m.role }}{% endfor %}{% for m in messages|reverse %}{{ "
     "m.content }}{% endfor %}",
     "userassistantYoHiSys"},
    {"{% for m in messages %}{% for c in m.role %}{% if loop.first %}{{ c|upper }}{% endif "
     "%}{% endfor %}{% endfor %}",
     "SUA"},
    {"{% set x %}\n  inner {{ l }}\n{% endset %}[{{ x }}]", "[  inner [3, 1, 2]\n]"},
    {"{% set x | upper %}abc{% endset %}{{ x }}", "ABC"},
    {"{% set a, b = [1, 2] %}{{ b }}{{ a }}", "21"},
    {"{% if messages %}{% set n = messages|length %}{% endif %}{{ n }}", "3"},
    {"{% for m in messages %}{% if loop.index0 == 1 %}{% set found = m.content %}{% endif %"
     "}{% endfor %}[{{ found }}]",
     "[]"},
    {"{% set x = [] %}{{ x.append(1) }}{{ x }}{% set _ = x.append(2) %}{{ x|length }}{% for"
     " i in range(2) %}{{ x.append(i) }}{% endfor %}{{ x }}",
     "None[1]2NoneNone[1, 2, 0, 1]"},
};

const char* const kCtxExpressions =
    R"json({"n": 3, "f": 2.5, "s": "Hello", "e": "", "nn": null, "t": true, "l": [3, 1, 2], "d": {"b": 1, "a": 2}, "u8": "héllo wörld ✓", "m": {"content": "<think>x</think>Yo", "k": [1, "é"]}})json";
const Case kExpressions[] = {
    {"{{ 2 * 3 ~ 4 }}", "64"},
    {"{{ not true ~ 'x' }}", "False"},
    {"{{ 'a' in 'abc' ~ 'd' }}", "True"},
    {"{{ 1 if true else 2 ~ 'x' }}", "1"},
    {"{{ [1, 2]|length ~ 'x' }}", "2x"},
    {"{{ x is defined ~ 'y' }}", "Falsey"},
    {"{{ -1|abs }}{{ (-1)|abs }}{{ - 1 ** 2 }}", "111"},
    {"{{ 'x' * 2 ** 2 }}", "xxxx"},
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ - n"
     " }} {{ -f|abs }}",
     "7 9 8 64 4 -3 2.5"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ -7 % "
     "-3 }} {{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.0 % 2 }} {{ 2 ** -1 }}",
     "3 -4 3.5 2.0 2 -2 -1 3.0 -4.0 1.0 0.5"},
    {"{{ 10 / 3 }} {{ 2 ** 0.5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 1.5e3 }} {{ 1234"
     "56789012345678.0 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e-7 }} {{ -0.0 }} {{ 1e300 * 1e10 }}",
     "3.3333333333333335 1.4142135623730951 0.30000000000000004 1e+20 1e-05 1500.0 1.234567"
     "8901234568e+17 1e+16 1000000000000000.0 1.5e-07 -0.0 inf"},
    {"{{ n }} {{ f }} {{ nn }} {{ t }} {{ l }} {{ d }} {{ 1.0 }} {{ 100.0 }} {{ 3.14159 }} "
     "{{ 0.5 }} {{ 1_000 }}",
     "3 2.5 None True [3, 1, 2] {'b': 1, 'a': 2} 1.0 100.0 3.14159 0.5 1000"},
    {"{{ [1, 'a', none, true, 1.0, (1,), (1, 2), {'k': 'it\\'s'}] }}",
     "[1, 'a', None, True, 1.0, (1,), (1, 2), {'k': \"it's\"}]"},
    {"{{ ['it\\'s', \"q\\\"\", 'b\\\\s', 'tab\\t', 'nl\\n', 'uni é'] }}{{ () }}{{ (1) }}{{ "
     "[] }}{{ {} }}{{ {'a': none} }}",
     "[\"it's\", 'q\"', 'b\\\\s', 'tab\\t', 'nl\\n', 'uni é']()1[]{}{'a': None}"},
    {"{{ 'a' * 3 }} {{ [0] * 3 }} {{ 3 * 'b' }} {{ [1, 2] + [3] }} {{ (1,) + (2,) }} {{ 'a'"
     " + 'b' }} {{ n + f }} {{ n * f }} {{ n - 1.5 }} {{ t + t }} {{ 1 + true }}",
     "aaa [0, 0, 0] bbb [1, 2, 3] (1, 2) ab 5.5 7.5 1.5 2 2"},
    {"{{ s ~ n ~ f }} {{ 'x' ~ [1] ~ {'a': 1} ~ none ~ true }} {{ undefined_var ~ 'a' }}",
     "Hello32.5 x[1]{'a': 1}NoneTrue a"},
    {"{{ n > 2 and s }} {{ e or 'fallback' }} {{ nn or 0 }} {{ n if n > 5 else 'small' }} ["
     "{{ 'yes' if not t }}] {{ none and 1 }} [{{ 0 or '' }}]",
     "Hello fallback 0 small [] None []"},
    {"{{ 'a' if 1 else 'b' if 2 else 'c' }} {{ 'a' if 0 else 'b' if 0 else 'c' }} {{ not 1 "
     "== 2 }} {{ not 1 in [1] }}",
     "a c True False"},
    {"{{ 1 == 1 != 2 }} {{ 'a' < 'b' <= 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] < "
     "[1, 2, 0] }} {{ (1, 2) == (1, 2) }} {{ [1] == (1,) }}",
     "True True True False True True False"},
    {"{{ 1 == true }} {{ 0 == false }} {{ 1.0 == 1 }} {{ 'a' != 'a' }} {{ d == {'a': 2, 'b'"
     ": 1} }} {{ l == [3, 1, 2] }} {{ none == none }} {{ undefined_var == none }}",
     "True True True False True True True False"},
    {"{{ 'ell' in s }} {{ 'x' not in s }} {{ 1 in l }} {{ 'a' in d }} {{ not 'a' in d }} {{"
     " {'b': 1, 'a': 2} in [d] }} {{ 'a' in undefined_var }}",
     "True True True True False True False"},
    {"{{ s[1:3] }} {{ s[-2:] }} {{ s[::2] }} {{ s[10:] }}|{{ s[-100:2] }} {{ l[::-1] }} {{ "
     "l[1] }} {{ l[-1] }} {{ s[0] }} {{ s[-1] }}",
     "el lo Hlo |He [2, 1, 3] 1 2 H o"},
    {"{{ u8[1:4] }} {{ u8[-1] }} {{ u8[1] }} {{ u8|length }} {{ u8[::-1] }} {{ 'abc'[::-1] "
     "}} {{ 'abc'[1:][::-1] }}",
     "éll ✓ é 13 ✓ dlröw olléh cba cb"},
    {"{{ (1, 2, 3)[1:] }} {{ [1, 2, 3][5:] }} {{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2, 3, 4, 5]"
     "[4:1:-2] }} {{ [1, 2, 3][:-1] }} {{ l[:] }}",
     "(2, 3) [] [1, 3, 5] [5, 3] [1, 2] [3, 1, 2]"},
    {"{{ m.content.split('</think>')[-1] }}|{{ m['content'].split('</think>')[0].strip() }}"
     "|{{ m.k.0 }}{{ m['k'][1] }}{{ m.k|last }}",
     "Yo|<think>x|1éé"},
    {"{{ {'a': 1}['a'] }} {{ [1, 2][0] }} {{ {'a': {'b': 'c'}}.a.b }} {{ [[1]][0][0] }} {{ "
     "{'x': [1, 2]}.x.1 }}",
     "1 1 c 1 2"},
    {"{{ l[5] is defined }} {{ d['zz'] is defined }} [{{ d.zz }}] [{{ l[7] }}] [{{ none.x }"
     "}]",
     "False False [] [] []"},
    {"{{ \"double\" }} {{ 'single' }} {{ 'a\\'b' }} {{ \"a\\\"b\" }} {{ '\\u00e9\\U0001F600"
     "\\x41' }} {{ 'a' 'b' \"c\" }} {{ '\\q' }} {{ '\\t|' }}",
     "double single a'b a\"b é😀A abc \\q \t|"},
    {"{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }} {{ [1,] }} {{ {'a"
     "': 1,} }} {{ (1,) }}",
     "True True False False None None [1] {'a': 1} (1,)"},
    {"{{ 1, 2 }} {% if 1, 2 %}x{% endif %} {% set x = 1, %}{{ x }}", "(1, 2) x (1,)"},
    {"{{ '%s-%d' % ('a', 3) }} {{ '%s' % 'x' }} {{ '%d%%' % 5 }} {{ '%r' % 'q' }}", "a-3 x 5% 'q'"},
};

const char* const kCtxFilters =
    R"json({"s": "Hello", "e": "", "nn": null, "l": [3, 1, 2], "d": {"b": 1, "a": 2}, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": null, "tool_calls": [{"name": "f"}]}], "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]})json";
const Case kFilters[] = {
    {"{{ s|upper }} {{ s|lower }} {{ 'hello WORLD'|capitalize }} {{ 'a-b c(d [e'|title }} {"
     "{ '  x  '|trim }} {{ 'xxhixx'|trim('x') }}",
     "HELLO hello Hello world A-B C(D [E x hi"},
    {"{{ l|length }} {{ s|count }} {{ d|length }} {{ 'héllo'|length }} {{ l|first }} {{ l|l"
     "ast }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}]",
     "3 5 2 5 3 2 a c []"},
    {"{{ l|sort|join('-') }} {{ l|sort(reverse=true)|list }} {{ ['b', 'A', 'a']|sort }} {{ "
     "['B', 'a', 'C']|sort(case_sensitive=true) }} {{ l }}",
     "1-2-3 [3, 2, 1] ['A', 'a', 'b'] ['B', 'C', 'a'] [3, 1, 2]"},
    {"{{ messages|map(attribute='role')|join(', ') }} {{ messages|join(',', attribute='role"
     "') }} {{ ['a', 'b']|map('upper')|join }} {{ ['1', '2']|map('int')|sum }}",
     "user, assistant user,assistant AB 3"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|selectat"
     "tr('tool_calls')|list|length }} {{ messages|rejectattr('content')|map(attribute='role"
     "')|first }}",
     "1 1 assistant"},
    {"{{ messages|selectattr('role', 'eq', 'user')|map(attribute='content')|first }} {{ mes"
     "sages|rejectattr('role', 'in', ['user', 'system'])|list|length }}",
     "Hi 1"},
    {"{{ [1, 2, 3, 4, 5, 6]|select('divisibleby', 3)|list }} {{ [0, 1, '', 'a', none]|selec"
     "t|list }} {{ ['a', 'b']|reject('equalto', 'a')|list }} {{ [1, 2, 3, 4]|select('odd')|"
     "list }}",
     "[3, 6] [1, 'a'] ['b'] [1, 3]"},
    {"{{ [{'n': 'b', 'v': 2}, {'n': 'a', 'v': 1}]|sort(attribute='n')|map(attribute='v')|li"
     "st }} {{ [{'n': 1}, {'n': 3}]|map(attribute='n')|sum }} {{ [{'n': 1}, {'n': 3}]|sum(a"
     "ttribute='n') }}",
     "[1, 2] 4 4"},
    {"{{ [{'n': 'b'}, {'n': 'a'}]|max(attribute='n') }} {{ ['x', 'X', 'y']|unique|list }} {"
     "{ ['x', 'X']|unique(case_sensitive=true)|list }} {{ [3, 1]|min }} {{ ['a', 'B']|max }"
     "} [{{ []|max }}] {{ [1, 2, 3]|sum }}",
     "{'n': 'b'} ['x', 'y'] ['x', 'X'] 1 B [] 6"},
    {"{{ [{'a': {'b': 1}}, {'a': {'b': 2}}]|map(attribute='a.b')|list }} {{ [[1, 2], [3, 4]"
     "]|map(attribute='1')|list }} {{ [{}, {'x': 1}]|map(attribute='x', default=0)|list }}",
     "[1, 2] [2, 4] [0, 1]"},
    {"{{ 'a,b'|replace(',', ';') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ '<a href=\"x\">&\\'"
     "'|escape }} {{ '<x>'|e }} {{ '<x>'|safe }} {{ 5|string }} {{ [1]|string }}",
     "a;b bba &lt;a href=&#34;x&#34;&gt;&amp;&#39; &lt;x&gt; <x> 5 [1]"},
    {"{{ 'text\nmore\n\nlast'|indent }}|{{ 'a\nb'|indent(2, first=true) }}|{{ ''|indent(2, "
     "true) }}|{{ 'a\n'|indent(3, blank=true) }}|{{ 'a\nb\n\nc\n'|indent(2) }}|{{ 'a\n"
     "b'|indent('> ') }}",
     "text\n    more\n\n    last|  a\n  b|  |a\n   |a\n  b\n\n  c\n"
     "|a\n> b"},
    {"{{ '42'|int + 1 }} {{ '0x1A'|int(0, 16) }} {{ '1e3'|int }} {{ nn|int }} {{ '12abc'|in"
     "t(-1) }} {{ '-5'|int }} {{ ' 7 '|int }} {{ 3.9|int }} {{ true|int }} {{ '3.7'|int }}",
     "43 26 1000 0 -1 -5 7 3 1 3"},
    {"{{ 3.7|float }} {{ '2.5e2'|float }} {{ nn|float(1.5) }} {{ 1|float }} {{ 'x'|float }}"
     " {{ -2.5|abs }} {{ true|abs }} {{ -3|abs }}",
     "3.7 250.0 1.5 1.0 0.0 2.5 1 3"},
    {"{{ 2.675|round(2) }} {{ 1.5|round }} {{ 2.5|round }} {{ 0.5|round }} {{ -2.5|round }}"
     " {{ 2.45|round(1) }} {{ 1234.5|round(-2) }} {{ 2.1|round(0, 'floor') }} {{ -2.1|round"
     "(0, 'ceil') }} {{ 7|round(1) }} {{ 2.4|round(0, 'ceil') }}",
     "2.67 2.0 2.0 0.0 -2.0 2.5 1200.0 2.0 -2.0 7 3.0"},
    {"{{ foo|default('x') }} [{{ foo|default }}] {{ nn|default('y') }} {{ e|default('z', tr"
     "ue) }} {{ 0|default(5, boolean=true) }} {{ foo|d('e') }} {{ ''|default('d') }}",
     "x [] None z 5 e "},
    {"{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value', reverse=tru"
     "e) }} {{ {'B': 1, 'a': 2}|dictsort(true) }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {"
     "{ d|items|list }}",
     "[('a', 2), ('b', 1)] [('b', 1), ('a', 2)] [('a', 2), ('b', 1)] [('B', 1), ('a', 2)] ["
     "('A', 2), ('a', 3), ('b', 1)] [('b', 1), ('a', 2)]"},
    {"{{ 'Hello World'|wordcount }} {{ 'a b  c'|wordcount }} [{{ 'x'|center(5) }}] [{{ 'abc"
     "'|center(9) }}] {{ 'long text here that goes'|truncate(10) }} {{ 'abcdefghijkl'|trunc"
     "ate(5, true, '..', 0) }}",
     "2 3 [  x  ] [   abc   ] long... abc.."},
    {"{{ 'hello world foo bar'|truncate(9) }}|{{ 'hello world foo bar'|truncate(9, true) }}"
     "|{{ 'hello world foo bar baz qux'|truncate(12) }}|{{ 'short'|truncate(3) }}",
     "hello...|hello ...|hello...|short"},
    {"{{ [1, 2, 3, 4, 5, 6, 7]|batch(3, 'x')|list }} {{ [1, 2, 3, 4, 5]|batch(2)|list }} {{"
     " l|reverse|list }} {{ 'abc'|reverse }} {{ s|list }} {{ d|list }}",
     "[[1, 2, 3], [4, 5, 6], [7, 'x', 'x']] [[1, 2], [3, 4], [5]] [2, 1, 3] cba ['H', 'e', "
     "'l', 'l', 'o'] ['b', 'a']"},
    {"{{ [' a ', 'b ']|map('trim')|list }} {{ [1, 2]|map('string')|join('+') }} {{ messages"
     "[0]|attr('role') }}|{{ 'x'|attr('upper') is callable }}",
     "['a', 'b'] 1+2 |True"},
    {"{{ tools|tojson }}",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": {\"type\""
     ": \"object\", \"properties\": {\"q\": {\"type\": \"string\"}}}}}]"},
    {"{{ tools[0]|tojson(indent=4) }}",
     "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get\",\n"
     "        \"parameters\": {\n            \"type\": \"object\",\n"
     "            \"properties\": {\n                \"q\": {\n                    \"type\""
     ": \"string\"\n                }\n            }\n        }\n    }\n"
     "}"},
    {"{{ {'a': [], 'b': {}, 'c': [1]}|tojson(indent=2) }}|{{ [1, 2]|tojson(indent='\\t') }}"
     "|{{ [1]|tojson(indent=0) }}",
     "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    1\n  ]\n}|[\n\t1,\n"
     "\t2\n]|[\n1\n]"},
    {"{{ 'é ✓ \\u0001\\t'|tojson }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ '😀'|tojson(ensur"
     "e_ascii=true) }}|{{ '</script>'|tojson }}",
     "\"é ✓ \\u0001\\t\"|\"\\u00e9\"|\"\\ud83d\\ude00\"|\"</script>\""},
    {"{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ 1.5|tojson }}"
     " {{ nn|tojson }} {{ 'a\"b\\\\'|tojson }} {{ {'x': 1e20, 'y': -0.0, 'z': 10.0}|tojson "
     "}} {{ {1: 'a', none: 2, true: 3}|tojson }}",
     "{\"a\": 2, \"b\": 1} {\"b\":1,\"a\":2} 1.5 null \"a\\\"b\\\\\" {\"x\": 1e+20, \"y\": "
     "-0.0, \"z\": 10.0} {\"1\": 3, \"null\": 2}"},
    {"{% filter upper %}abc{{ 'd' }}{% endfilter %} {% filter replace('a', 'o')|title %}a b"
     "anana{% endfilter %}",
     "ABCD O Bonono"},
};

const char* const kCtxTests =
    R"json({"n": 3, "f": 2.5, "s": "hello", "nn": null, "t": true, "l": [1, 2], "d": {"a": 1}, "fn": null})json";
const Case kTests[] = {
    {"{{ nn is none }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ s is string"
     " }} {{ l is sequence }} {{ d is mapping }} {{ l is mapping }} {{ t is boolean }} {{ t"
     " is true }} {{ nn is false }}",
     "True True True True True True True False True True False"},
    {"{{ true is number }} {{ true is integer }} {{ 1.0 is integer }} {{ 'a' is sequence }}"
     " {{ {} is sequence }} {{ f is number }} {{ '1' is number }}",
     "True False False True True True False"},
    {"{{ foo is undefined }} {{ foo is not defined }} {{ foo is defined }} {{ s is lower }}"
     " {{ 'Abc' is lower }} {{ 'ABC' is upper }} {{ 5 is odd }} {{ 5 is even }} {{ 10 is di"
     "visibleby(5) }} {{ 10 is divisibleby 3 }}",
     "True True False True False True True False True False"},
    {"{{ 'a' is in 'cat' }} {{ 2 is in l }} {{ 'a' is in d }} {{ 3 is gt 2 }} {{ 3 is ge 3 "
     "}} {{ 2 is lt 1 }} {{ 2 is le 2 }} {{ 1 is ne 2 }} {{ 1 is eq 1 }} {{ 1 is equalto 2 "
     "}} {{ 2 is greaterthan 1 }} {{ 2 is lessthan 1 }}",
     "True True True True True False True True True False True False"},
    {"{{ range is callable }} {{ s is callable }} {{ s is iterable }} {{ n is iterable }} {"
     "{ d is iterable }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }}"
     " {{ s.upper is callable }}",
     "True False True False True True True False True"},
    {"{{ l is sameas l }} {{ [] is sameas [] }} {{ none is sameas none }} {{ t is sameas tr"
     "ue }} {{ s is not string }} {{ nn is not none }}",
     "True False True True False False"},
    {"{% if n is defined and n is not none and n > 2 %}ok{% endif %} {{ 'y' if foo is defin"
     "ed else 'n' }} {{ not foo is defined }}",
     "ok n True"},
};

const char* const kCtxMethods =
    R"json({"s": "Hello", "u8": "héllo wörld", "l": [3, 1, 3], "d": {"b": 1, "a": 2}})json";
const Case kMethods[] = {
    {"{{ '  a b  '.strip() }}|{{ '--a--'.lstrip('-') }}|{{ '--a--'.rstrip('-') }}|{{ 'xyaxy"
     "'.strip('yx') }}|{{ '\\n x \\t'.strip() }}|{{ 'ééaé'.strip('é') }}",
     "a b|a--|--a|a|x|a"},
    {"{{ 'a b  c'.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ' "
     "a  b '.split(none, 1) }}|{{ ' a  b '.rsplit(none, 1) }}|{{ 'a,b,,c'.split(',') }}|{{ "
     "''.split() }}|{{ ''.split(',') }}",
     "['a', 'b', 'c']|['a', 'b c']|['a,b', 'c']|['a', 'b ']|[' a', 'b']|['a', 'b', '', 'c']"
     "|[]|['']"},
    {"{{ s.startswith('He') }} {{ s.endswith(('x', 'lo')) }} {{ s.startswith('he') }} {{ s."
     "upper() }} {{ s.lower() }} {{ 'hello there'.title() }} {{ \"it's o'neil\".title() }} "
     "{{ 'hELLO'.capitalize() }}",
     "True True False HELLO hello Hello There It'S O'Neil Hello"},
    {"{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ 'ab'.replace('', '-') }} {{"
     " s.find('l') }} {{ s.rfind('l') }} {{ s.find('z') }} {{ u8.find('w') }} {{ s.count('l"
     "') }} {{ s.index('o') }}",
     "HeLLo HeLlo -a-b- 2 3 -1 6 2 4"},
    {"{{ '-'.join(['a', 'b']) }} {{ ', '.join(d) }} {{ '{} and {}'.format(1, 'x') }} {{ '{1"
     "}{0}{name}'.format('a', 'b', name='n') }} {{ '{{}}{}'.format(5) }}",
     "a-b b, a 1 and x ban {}5"},
    {"{{ d.get('a') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }} {{ d.keys()|list }} {{ d."
     "values()|list }} {{ d.items()|list }} {{ d['get']('b') }}",
     "2 def None ['b', 'a'] [1, 2] [('b', 1), ('a', 2)] 1"},
    {"{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'a1'.isalnum() }} {{"
     " ''.isdigit() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ 'a\\nb\\r\\nc'.splitlin"
     "es() }}",
     "True True True True False True True ['a', 'b', 'c']"},
    {"{{ l.index(1) }} {{ l.count(3) }} {{ [1, 'a'].index('a') }}", "1 2 1"},
    // Mutating methods (Kimi K2's template queues call ids with append and pop(0)).
    {"{% set x = [1, 2, 3, 4] %}{{ x.pop() }}{{ x.pop(0) }}{{ x.pop(-1) }}{{ x }}", "413[2]"},
    {"{% set x = [1, 2] %}{{ x.insert(0, 'a') }}{{ x.insert(-1, 'b') }}{{ x.insert(9, 'c') }}"
     "{{ x }}",
     "NoneNoneNone['a', 1, 'b', 2, 'c']"},
    {"{% set x = [3, 1, 3] %}{{ x.remove(3) }}{{ x }}{% set y = x.copy() %}{{ y.reverse() }}"
     "{{ y }}{{ x }}{{ x.clear() }}{{ x }}",
     "None[1, 3]None[3, 1][1, 3]None[]"},
    {"{% set ns = namespace(q=['a', 'b']) %}{% set first = ns.q.pop(0) %}{{ first }}{{ ns.q }}",
     "a['b']"},
    {"{% set d = {'a': 1} %}{{ d.setdefault('b', 2) }}{{ d.setdefault('a', 9) }}{{ d.pop('a') "
     "}}{{ d.pop('z', 0) }}{{ d }}",
     "2110{'b': 2}"},
    {"{% set d = {'a': 1} %}{% set e = d.copy() %}{{ e.update({'b': 2}, c=3) }}{{ e }}{{ d }}",
     "None{'a': 1, 'b': 2, 'c': 3}{'a': 1}"},
};

const char* const kCtxMacros = R"json({"s": "ctx"})json";
const Case kMacros[] = {
    {"{% macro m(a, b=2) %}[{{ a }},{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(b=5, "
     "a=0) }}{{ m() }}",
     "[1,2][1,3][0,5][,2]"},
    {"{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, x=3) }}",
     "1(2,){'x': 3}"},
    {"{% macro m() %}{{ s }}{{ x }}{% endmacro %}{% set x = 5 %}{{ m() }}", "ctx5"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }"
     "}",
     "54321"},
    {"{% macro m(a, b='x' ~ a) %}{{ b }}{% endmacro %}{{ m(1) }}", "x1"},
    {"{% macro m(x) %}{% set s = 'inner' %}{{ s }}{{ x }}{% endmacro %}{{ m(1) }}{{ s }}",
     "inner1ctx"},
    {"{% macro render(msg) %}<{{ msg.role }}>{{ msg.content | trim }}</{{ msg.role }}>{% en"
     "dmacro %}{% for m in [{'role': 'user', 'content': ' hi '}] %}{{ render(m) }}{% endfor"
     " %}",
     "<user>hi</user>"},
    {"{% macro m() %}a{% endmacro %}{{ m() ~ m() }}{{ m()|length }}{{ m is callable }}", "aa1True"},
};

const char* const kCtxChatTemplateIdioms =
    R"json({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}, {"role": "assistant", "content": "ok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}, {"function": {"name": "g", "arguments": "{}"}}]}], "tools": [{"name": "f", "description": "d"}, {"name": "g"}]})json";
const Case kChatTemplateIdioms[] = {
    {"{{ '[' ~ messages[2].tool_calls | map(attribute='function.name') | join(', ') ~ ']' }"
     "}",
     "[f, g]"},
    {"{% set tools2 = tools if tools is defined else [] %}{{ tools2|length }}", "2"},
    {"{{ messages[1]['content'][0]['text'] }}{{ messages[1].content|selectattr('type', 'eq'"
     ", 'image')|list|length }}",
     "hi1"},
    {"{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}[{{ m.role }}]{% e"
     "ndif %}{% endfor %}",
     "[system]"},
    {"{{ (messages|selectattr('role', 'equalto', 'system')|list|first).content }}{{ (messag"
     "es|last).role }}{{ messages[-1].role == 'assistant' }}",
     "SassistantTrue"},
    {"{{ tools|map('tojson')|join('\\n') }}",
     "{\"name\": \"f\", \"description\": \"d\"}\n{\"name\": \"g\"}"},
    {"{{ tools|map('tojson', indent=1)|join('\\n') }}",
     "{\n \"name\": \"f\",\n \"description\": \"d\"\n}\n{\n \"name\": \"g\"\n"
     "}"},
    {"{{ messages[2].tool_calls[0].function.arguments|tojson|safe }}", "{\"a\": 1}"},
    {"{{ '%s and %s'|format('a', 1) }}", "a and 1"},
    {"{{- '<tool>' + tools[0] | tojson + '</tool>' -}}",
     "<tool>{\"name\": \"f\", \"description\": \"d\"}</tool>"},
    {"{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% s"
     "et ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.last }}",
     "1"},
    {"{{ raise_exception('no') if false }}ok", "ok"},
    {"{% if messages[0].content is string and messages[0].content|length > 0 %}y{% endif %}", "y"},
    {"{%- for tool in tools %}{{- tool.name }}{{- ', ' if not loop.last }}{% endfor %}", "f, g"},
    {"{{ tools|selectattr('description', 'defined')|list|length }}{{ tools|selectattr('desc"
     "ription', 'undefined')|map(attribute='name')|first }}",
     "1g"},
    {"{% set c = messages[1].content %}{% if c is not string %}{% for p in c %}{% if p.type"
     " == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<image>{% endif %}{% endfor %}{%"
     " endif %}",
     "hi<image>"},
    {"{{ {'b': 1, 'a': {'y': [1, 2], 'x': none}}|tojson(indent=2, sort_keys=true) }}",
     "{\n  \"a\": {\n    \"x\": null,\n    \"y\": [\n      1,\n      2\n"
     "    ]\n  },\n  \"b\": 1\n}"},
    {"{{ 'Hello {name}!'.format(name='you') }}{{ messages|length is divisibleby 3 }}",
     "Hello you!True"},
    {"{{ messages[0] is mapping }}{{ messages is sequence }}{{ 'x' is mapping }}", "TrueTrueFalse"},
    {"{% set d = {'role': 'x'} %}{{ d.role }}{{ d['role'] }}{{ d.items()|list }}",
     "xx[('role', 'x')]"},
    {"{% set ns = namespace(items=[1]) %}{{ ns.items }}", "[1]"},
    {"{% set d = {'items': 5, 'values': 6} %}{{ d['items'] }}{{ d.get('values') }}", "56"},
    {"{{ 'a' if messages else 'b' }}{{ [] if none else 'e' }}", "ae"},
    {"{% for i in range(3) %}{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}", "0, 1, 2"},
    {"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% else"
     " %}{% set loop_messages = messages %}{% endif %}{{ loop_messages|length }}",
     "2"},
    {"{{ '\\u2581' }}{{ '<｜User｜>'|length }}", "▁8"},
    {"{{ messages[2].tool_calls|length > 0 and messages[2].content }}", "ok"},
    {"{% for m in messages %}{{ loop.index0 is even }}{% endfor %}", "TrueFalseTrue"},
    {"{{ 'abc'|upper|lower|capitalize }}{{ ' a '|trim|length }}", "Abc1"},
    {"{{ 1 if true }}{{ 2 if false }}{{ none|string }}{{ none|lower }}", "1Nonenone"},
    {"{{ messages|rejectattr('role', 'equalto', 'system')|map(attribute='role')|join('|') }"
     "}",
     "user|assistant"},
    {"{% set x = messages|selectattr('role', 'in', ['user', 'system'])|list %}{{ x|length }"
     "}",
     "2"},
    {"{{ [1, 2, 3]|map('string')|join }}{{ [1.5, 2]|sum }}{{ [[1], [2]]|sum(start=[]) }}",
     "1233.5[1, 2]"},
    {"{{ messages[1:3]|map(attribute='role')|list }}{{ messages[:1]|length }}",
     "['user', 'assistant']1"},
};

}  // namespace

TEST_CASE("jinja: Whitespace as jinja2 renders them") {
    check_cases(kCtxWhitespace, kWhitespace);
}

TEST_CASE("jinja: LoopsAndScoping as jinja2 renders them") {
    check_cases(kCtxLoopsAndScoping, kLoopsAndScoping);
}

TEST_CASE("jinja: Expressions as jinja2 renders them") {
    check_cases(kCtxExpressions, kExpressions);
}

TEST_CASE("jinja: Filters as jinja2 renders them") {
    check_cases(kCtxFilters, kFilters);
}

TEST_CASE("jinja: Tests as jinja2 renders them") {
    check_cases(kCtxTests, kTests);
}

TEST_CASE("jinja: Methods as jinja2 renders them") {
    check_cases(kCtxMethods, kMethods);
}

TEST_CASE("jinja: Macros as jinja2 renders them") {
    check_cases(kCtxMacros, kMacros);
}

TEST_CASE("jinja: ChatTemplateIdioms as jinja2 renders them") {
    check_cases(kCtxChatTemplateIdioms, kChatTemplateIdioms);
}

TEST_CASE("jinja: the context's variables, bos_token and a reused template") {
    auto t =
        JinjaTemplate::parse("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}");
    json ctx = {{"bos_token", "<s>"}, {"messages", json::array({{{"role", "user"}}})}};
    CHECK(t.render(ctx) == "<s>[user]");
    JinjaTemplate copy = t;  // cheap: shares the parsed tree
    CHECK(copy.render(ctx) == "<s>[user]");
    CHECK(&copy.source() == &t.source());
    CHECK(t.render(json::object()) == "");  // missing variables are undefined: ""
    CHECK(t.render(json()) == "");          // a null context is an empty one
    CHECK_THROWS_AS(t.render(json::array()), Error);
    // JSON values keep their order and types.
    json v = json::parse(R"({"x": {"z": 1, "a": [true, null, 1.5, "s"]}})");
    CHECK(render("{{ x|tojson }}|{{ x }}", v) ==
          "{\"z\": 1, \"a\": [true, null, 1.5, \"s\"]}|{'z': 1, 'a': [True, None, 1.5, 's']}");
    CHECK(render("{{ big }} {{ neg }}", {{"big", uint64_t(1) << 63}, {"neg", -5}}) ==
          "9.223372036854776e+18 -5");
}

TEST_CASE("jinja: strftime_now formats the current local time") {
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    std::string out = render("{{ strftime_now('%Y') }}|{{ strftime_now('%d %b %Y')|length }}");
    CHECK(out.substr(0, 4) == std::to_string(1900 + tm.tm_year));
    CHECK(out.substr(4) == "|11");
}

TEST_CASE("jinja: syntax errors name the line and column") {
    struct {
        const char* tmpl;
        const char* message;
    } cases[] = {
        {"{% if true %}\nunclosed",
         "line 1, column 1: unclosed 'if' block: end of template reached, expected 'elif' or "
         "'else' or 'endif'"},
        {"{% for x in l %}\nno end", "line 1, column 1: unclosed 'for' block"},
        {"a\n  {{ x + }}", "line 2, column 10: unexpected end of print statement"},
        {"{% for x in l %}\n{% foo %}\n{% endfor %}", "line 2, column 1: unknown statement 'foo'"},
        {"{{ x | nosuch }}", "line 1, column 8: no filter named 'nosuch'"},
        {"line\n{{ x is nosuch }}", "line 2, column 9: no test named 'nosuch'"},
        {"{{ 'abc }}", "line 1, column 4: unterminated string literal"},
        {"{# never closed", "line 1, column 1: unclosed comment"},
        {"{{ never closed", "line 1, column 1: unclosed tag (missing '}}')"},
        {"{% if x", "line 1, column 1: unclosed tag (missing '%}')"},
        {"{% endfor %}", "line 1, column 1: unexpected 'endfor'"},
        {"{% if x %}{% else %}{% elif y %}{% endif %}", "line 1, column 21: unexpected 'elif'"},
        {"{% break %}", "line 1, column 1: 'break' outside of a loop"},
        {"{% raw %}x", "line 1, column 10: missing {% endraw %}"},
        {"{{ a b }}", "line 1, column 6: expected '}}', got 'b'"},
        {"{{ 1 @ 2 }}", "line 1, column 6: unexpected character '@'"},
        {"{{ f(a=1, 2) }}", "line 1, column 11: positional argument after keyword argument"},
        {"{% macro m(a %}{% endmacro %}", "line 1, column 15: unexpected '}', expected ')'"},
        {"{{ [1, 2 }}", "line 1, column 10: unexpected '}', expected ']'"},
        {"{{ (1, [2]", "line 1, column 4: unclosed '('"},
        {"{% include 'x' %}", "line 1, column 1: unsupported statement 'include'"},
        {"{{ }}", "line 1, column 4: unexpected end of print statement"},
        {"{% set %}", "line 1, column 8: expected a name, got end of statement block"},
        {"{% for x l %}{% endfor %}", "line 1, column 10: expected 'in', got 'l'"},
        {"{{ 99999999999999999999 }}", "line 1, column 4: bad number literal"},
    };
    for (auto& c : cases) {
        std::string tmpl = c.tmpl;
        CAPTURE(tmpl);
        std::string msg;
        try {
            JinjaTemplate::parse(c.tmpl);
        } catch (const Error& e) {
            msg = e.what();
        }
        CHECK(msg.rfind(c.message, 0) == 0);  // starts with
        if (msg.rfind(c.message, 0) != 0) MESSAGE(msg);
    }
}

TEST_CASE("jinja: runtime errors") {
    json ctx = {{"s", "x"}, {"n", 1}, {"l", json::array({1})}};
    // raise_exception's message is the whole error.
    CHECK(error_of("{{ raise_exception('Roles must alternate') }}") == "Roles must alternate");
    CHECK(error_of("{% if true %}\n  {{ raise_exception('a' ~ 1) }}{% endif %}") == "a1");
    struct {
        const char* tmpl;
        const char* message;
    } cases[] = {
        {"{{ foo.bar }}", "line 1, column 1: 'foo' is undefined"},
        {"{{ m() }}{% macro m() %}x{% endmacro %}", "'m' is undefined"},
        {"x\n{{ foo['k'] }}", "line 2, column 1: 'foo' is undefined"},
        {"{{ s.foo.bar }}", "line 1, column 1: 'str object' has no attribute 'foo'"},
        {"{{ foo() }}", "'foo' is undefined"},
        {"{{ foo + 1 }}", "'foo' is undefined"},
        {"{{ foo|tojson }}", "Object of type Undefined is not JSON serializable"},
        {"{{ s() }}", "'str' object is not callable"},
        {"{{ 1 / 0 }}", "float division by zero"},
        {"{{ 1 // 0 }}", "integer division or modulo by zero"},
        {"{{ 'a' + 1 }}", "can only concatenate str (not \"int\") to str"},
        {"{{ 1 + 'a' }}", "unsupported operand type(s) for +: 'int' and 'str'"},
        {"{{ 'a' < 1 }}", "'<' not supported between instances of 'str' and 'int'"},
        {"{{ 1 in 5 }}", "argument of type 'int' is not iterable"},
        {"{% for x in n %}{% endfor %}", "'int' object is not iterable"},
        {"{% set a, b = [1, 2, 3] %}", "cannot unpack 3 values into 2 names"},
        {"{% set s.attr = 1 %}", "cannot assign attribute on non-namespace object 's'"},
        {"{{ l[::0] }}", "slice step cannot be zero"},
        {"{{ namespace()|tojson }}", "Object of type Namespace is not JSON serializable"},
        {"{{ l.index(5) }}", "5 is not in list"},
        {"{{ s|upper(1) }}", "upper() takes at most 0 argument(s) (1 given)"},
        {"{{ s|join(x=1) }}", "join() got an unexpected keyword argument 'x'"},
        {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
         "macro 'm' takes not more than 1 argument(s)"},
        {"{% macro m(a) %}{% endmacro %}{{ m(c=2) }}", "macro 'm' takes no keyword argument 'c'"},
        {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
        {"{{ [1, 'a']|sort }}", "'<' not supported between instances of 'str' and 'int'"},
        {"{{ [].pop() }}", "pop from empty list"},
        {"{{ l.pop(3) }}", "pop index out of range"},
        {"{{ l.remove(7) }}", "list.remove(x): x not in list"},
        {"{{ {}.pop('k') }}", "KeyError: 'k'"},
        {"{{ (1, 2).pop() }}", "'tuple' object has no attribute 'pop'"},
    };
    for (auto& c : cases) {
        std::string tmpl = c.tmpl;
        CAPTURE(tmpl);
        std::string msg = error_of(c.tmpl, ctx);
        CHECK(msg.find(c.message) != std::string::npos);
        if (msg.find(c.message) == std::string::npos) MESSAGE(msg);
    }
}

TEST_CASE("jinja: hostile templates stop with an Error") {
    auto repeat = [](std::string_view s, int n) {
        std::string out;
        for (int k = 0; k < n; ++k) out += s;
        return out;
    };
    // Deep nesting is refused by the parser (so nothing recurses deeply later).
    const char* deep = "nested too deeply";
    CHECK(fails_with("{{ " + repeat("(", 10000) + "1" + repeat(")", 10000) + " }}", deep));
    CHECK(fails_with("{{ " + repeat("1 + ", 100000) + "1 }}", deep));
    CHECK(fails_with("{{ " + repeat("[", 5000) + repeat("]", 5000) + " }}", deep));
    CHECK(fails_with("{{ " + repeat("not ", 5000) + "1 }}", deep));
    CHECK(fails_with("{{ x" + repeat(".a", 5000) + " }}", deep));
    CHECK(fails_with("{{ x" + repeat("|trim", 5000) + " }}", deep));
    CHECK(fails_with(repeat("{% if true %}", 2000) + repeat("{% endif %}", 2000), deep));
    CHECK(fails_with(repeat("{% for i in [1] %}", 2000) + repeat("{% endfor %}", 2000), deep));
    // Nesting below the limit is fine.
    CHECK(render("{{ " + repeat("(", 60) + "1" + repeat(")", 60) + " }}") == "1");
    CHECK(render(repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100)) == "x");
    // Unbounded recursion; recursion within bounds works.
    CHECK(
        fails_with("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion too deep"));
    CHECK(
        fails_with("{% macro f() %}{% for x in [1] %}{% if true %}{{ f() }}{% endif %}{% endfor "
                   "%}{% endmacro %}{{ f() }}",
                   "recursion too deep"));
    CHECK(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro "
                 "%}{{ f(50)|length }}") == "92");
    // Runaway work: exponential macro calls, nested loops, big values, big output.
    JinjaTemplate::Limits small;
    small.max_steps = 100000;
    small.max_output = 1 << 20;
    const json none = json::object();
    CHECK(
        fails_with("{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% "
                   "endmacro %}{{ f(0) }}",
                   "ran too long", none, small));
    CHECK(fails_with("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                     "ran too long", none, small));
    CHECK(fails_with("{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",
                     "too large", none, small));
    CHECK(
        fails_with("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ "
                   "ns.s %}{% endfor %}",
                   "too large", none, small));
    CHECK(
        fails_with("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + "
                   "ns.l %}{% endfor %}",
                   "too large", none, small));
    CHECK(fails_with("{{ range(1000000000) }}", "range() too large"));
    CHECK(fails_with("{{ 'a' * 1000000000 }}", "too large"));
    CHECK(fails_with("{{ [1] * 1000000000 }}", "too large"));
    CHECK(fails_with("{{ 'a'|center(1000000000) }}", "too large"));
    CHECK(fails_with("{{ 'aaaa'|replace('a', 'b' * 30000000) }}", "too large"));
    CHECK(
        fails_with("{% for i in range(100) %}{% for j in range(100) %}{% set y = big|tojson %}"
                   "{% endfor %}{% endfor %}",
                   "too much work", {{"big", std::string(10000, 'x')}}, small));
    // Self-referencing values: printing, JSON and comparison stay bounded.
    CHECK(fails_with("{% set x = [] %}{% for i in range(10) %}{{ x.append(x) }}{% endfor %}{{ x }}",
                     "too large", none, small));
    CHECK(fails_with("{% set x = [] %}{{ x.append(x) }}{{ x|tojson }}", deep));
    CHECK(fails_with(
        "{% set a = [] %}{% set b = [] %}{{ a.append(a) }}{{ b.append(b) }}{{ a == b }}", deep));
    CHECK_NOTHROW(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"));
    // A context nested too deeply (say, from a hostile request) is refused, not a crash.
    std::string nested = repeat("[", 100000) + repeat("]", 100000);
    CHECK(fails_with("{{ x|length }}", "nested too deeply", {{"x", json::parse(nested)}}));
}
