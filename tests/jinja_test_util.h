// Helpers of the Jinja interpreter's tests (test_jinja.cpp, test_jinja_templates.cpp):
// render a template, catch its Error, and check tables of cases whose expected outputs come
// from Python's jinja2 3.1 set up as Hugging Face transformers renders chat templates
// (trim_blocks, lstrip_blocks, loopcontrols; tojson as json.dumps with ensure_ascii=False;
// raise_exception and strftime_now globals).
#pragma once

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common.h"
#include "jinja.h"

namespace kvrun::test {

using json = nlohmann::ordered_json;

inline std::string render(std::string_view tmpl, const json& ctx = json::object()) {
    return JinjaTemplate::parse(tmpl).render(ctx);
}

// The message of the kvrun::Error that parsing + rendering throws ("" when none).
inline std::string error_of(std::string_view tmpl, const json& ctx = json::object(),
                            const JinjaTemplate::Limits& limits = {}) {
    try {
        JinjaTemplate::parse(tmpl).render(ctx, limits);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Whether rendering fails with an Error whose message contains `text`.
inline bool fails_with(std::string_view tmpl, std::string_view text,
                       const json& ctx = json::object(), const JinjaTemplate::Limits& limits = {}) {
    return error_of(tmpl, ctx, limits).find(text) != std::string::npos;
}

struct Case {
    const char* tmpl;
    const char* expected;
};

// Renders every case with the group's context and compares with jinja2's output.
template <size_t N>
void check_cases(const char* context, const Case (&cases)[N]) {
    json ctx = json::parse(context);
    for (const Case& c : cases) {
        std::string tmpl = c.tmpl;
        CAPTURE(tmpl);
        std::string out;
        CHECK_NOTHROW(out = render(c.tmpl, ctx));
        CHECK(out == c.expected);
    }
}

// A whole template rendered for a conversation: jinja2's output, or its error message.
struct Render {
    const char* context;
    const char* expected;
    bool error;
};

template <size_t N>
void check_renders(const char* tmpl, const Render (&renders)[N]) {
    JinjaTemplate t = JinjaTemplate::parse(tmpl);
    for (const Render& r : renders) {
        std::string context = r.context;
        CAPTURE(context);
        json ctx = json::parse(r.context);
        if (r.error) {
            std::string msg;
            try {
                t.render(ctx);
            } catch (const Error& e) {
                msg = e.what();
            }
            CHECK(msg == r.expected);
        } else {
            std::string out;
            CHECK_NOTHROW(out = t.render(ctx));
            CHECK(out == r.expected);
        }
    }
}

}  // namespace kvrun::test
