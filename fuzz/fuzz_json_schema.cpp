// libFuzzer target for JSON Schema -> GBNF (schemas arrive in JSON requests): the input is a
// JSON text. A schema must either convert or throw kvrun::Error (never crash or hang), and a
// converted grammar must compile: Grammar::parse may refuse it only as left-recursive (a $ref
// to itself) or too large, never for a syntax error the converter wrote. Run with
// KVRUN_FUZZ_WRITE_SEEDS=<dir> to write a small seed corpus and exit.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common.h"
#include "fuzz_seeds.h"
#include "grammar.h"
#include "json_schema.h"

namespace {

void write_seeds(const char* dir) {
    const char* seeds[] = {
        R"({})",
        R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3},
           "b": {"type": "integer", "minimum": -5, "maximum": 120}}, "required": ["b"]})",
        R"({"type": "array", "items": {"enum": ["x", 1, null]}, "minItems": 1, "maxItems": 4})",
        R"({"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}},
           "$ref": "#/$defs/n"})",
        R"({"anyOf": [{"type": "number"}, {"const": [1, {"a": true}]}],
           "allOf": [{"type": ["number", "string"]}]})",
        R"({"type": "string", "format": "date-time"})",
        R"({"prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": false})",
        R"({"type": "object", "additionalProperties": {"type": "integer",
           "exclusiveMaximum": 10}})",
    };
    int n = 0;
    for (const char* s : seeds)
        std::ofstream(std::string(dir) + "/seed_" + std::to_string(n++), std::ios::binary) << s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return fuzz_write_seeds_if_asked(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    nlohmann::ordered_json schema;
    try {
        schema = nlohmann::ordered_json::parse(data, data + size);
    } catch (const nlohmann::json::exception&) {
        return 0;
    }
    std::string gbnf;
    try {
        gbnf = kvrun::json_schema_to_grammar(schema);
    } catch (const kvrun::Error&) {
        return 0;
    }
    try {
        kvrun::Grammar::parse(gbnf);
    } catch (const kvrun::Error& e) {
        const std::string what = e.what();
        if (what.find("left-recursive") == std::string::npos &&
            what.find("too large") == std::string::npos &&
            what.find("nested more than") == std::string::npos) {
            std::fprintf(stderr, "fuzz_json_schema: the converter wrote a bad grammar: %s\n%s\n",
                         what.c_str(), gbnf.c_str());
            std::abort();
        }
    }
    return 0;
}
