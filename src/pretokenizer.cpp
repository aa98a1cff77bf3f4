// BPE pre-tokenizers: the regex list per tokenizer.ggml.pre name and a PCRE2 splitter that
// applies such a list the way llama.cpp does (each regex inside the previous pieces; text
// between matches is kept as its own piece).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "pretokenizer.h"

#include <pcre2.h>

#include <initializer_list>

#include "common.h"
#include "unicode_text.h"

namespace kvrun {

namespace {

// The GPT-2 pattern; several pre-tokenizers reuse it as one step of their sequence.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama-3 style (contractions in either case, letters with one leading non-letter).
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama-3 but single digits.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Seed-Coder / Seed-OSS: as Qwen2, but a punctuation run takes no line breaks after it.
constexpr const char* kSeedCoder =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";

// CJK ideographs (+ Hangul) as one run, used by the DeepSeek pre-tokenizers.
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek LLM: cased letters of many scripts (the ranges of its tokenizer.json).
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
    R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";

constexpr const char* kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";

// Words split at whitespace and a few (also CJK/Indic/Arabic) punctuation marks.
constexpr const char* kPoro =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

// GPT-4o's o200k pattern (Phi-4-mini, Llama 4) in the form llama.cpp runs: Tekken's cased
// words with English contractions attached, digits in threes.
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kTekken = R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|)"
                                R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|)"
                                R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kDeepseekV3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
    R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool name_in(const std::string& name, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (name == n) return true;
    return false;
}

// Unicode White_Space as a class body: what llama.cpp's `\s` matches (ASCII isspace plus
// the non-ASCII White_Space code points it folds to a whitespace placeholder).
constexpr const char* kWhiteSpaceBody =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites `\s` / `\S` to explicit White_Space classes (PCRE2's own `\s` differs slightly).
std::string expand_whitespace(const std::string& re) {
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < re.size(); ++i) {
        const char c = re[i];
        if (c == '\\' && i + 1 < re.size()) {
            const char e = re[i + 1];
            ++i;
            if (e == 's') {
                out += in_class ? std::string(kWhiteSpaceBody)
                                : "[" + std::string(kWhiteSpaceBody) + "]";
            } else if (e == 'S' && !in_class) {
                out += "[^" + std::string(kWhiteSpaceBody) + "]";
            } else if (e == 'S') {
                fail("pre-tokenizer regex uses \\S inside a class (unsupported): {}", re);
            } else {
                out += c;
                out += e;
            }
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            out += c;
            if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
            if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];  // literal ']' first
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        out += c;
    }
    return out;
}

}  // namespace

PreTokenizerSpec pretokenizer_spec(const std::string& pre) {
    PreTokenizerSpec s;
    if (pre.empty() || pre == "default") {
        s.regexes = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
    } else if (name_in(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3"})) {
        s.regexes = {kLlama3};
        s.ignore_merges = true;
        s.add_bos = true;
    } else if (name_in(pre, {"dbrx", "smaug-bpe"})) {
        s.regexes = {kLlama3};
    } else if (pre == "deepseek-llm") {
        s.regexes = {"[\r\n]",  kDeepseekLetters, kDeepseekPunct,
                     R"(\s+$)", kDeepseekCjk,     R"(\p{N}+)"};
    } else if (pre == "deepseek-coder") {
        s.regexes = {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"};
    } else if (pre == "deepseek-v3") {
        s.regexes = {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
                     kDeepseekV3};
    } else if (pre == "falcon") {
        s.regexes = {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"};
    } else if (name_in(pre, {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                             "minerva-7b"})) {
        s.regexes = {R"(\p{N})", kGpt2};
    } else if (name_in(pre, {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en",
                             "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", "mpt",
                             "olmo", "jais", "exaone4"})) {
        s.regexes = {kGpt2};
    } else if (name_in(pre, {"qwen2", "qwen2.5", "qwen-2.5", "deepseek-r1-qwen", "megrez",
                             "stablelm2"})) {
        s.regexes = {kQwen2};
    } else if (pre == "seed-coder") {  // (Seed-OSS)
        s.regexes = {kSeedCoder};
    } else if (name_in(pre, {"poro-chat", "bloom", "gpt3-finnish"})) {
        s.regexes = {kPoro};
    } else if (name_in(pre, {"chatglm-bpe", "glm4"})) {  // (GLM 4.x: no BOS of its own)
        s.regexes = {kLlama3};
        s.no_bos = true;
    } else if (pre == "viking") {
        s.regexes = {kPoro, R"(\p{N})"};
    } else if (name_in(pre, {"gpt-4o", "llama4"})) {  // o200k (Phi-4-mini, Llama 4)
        s.regexes = {kGpt4o};
    } else if (pre == "tekken") {
        s.regexes = {kTekken};
        s.ignore_merges = true;
        s.add_bos = true;
    } else if (pre == "chameleon") {
        s.regexes = {"<sentinel:[0-9]+>",       "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                     "([\\t\\n]|    |  )",      R"(\p{N})",
                     R"([\p{P}!-/:-@\[-`{-~])", kGpt2};
        s.add_bos = true;
    } else {
        throw Error(fmt::format("unknown BPE pre-tokenizer '{}' (tokenizer.ggml.pre)", pre),
                    "this vocabulary's pre-tokenizer is not supported by kvrun");
    }
    return s;
}

struct RegexSplitter::Impl {
    std::vector<pcre2_code*> codes;
    ~Impl() {
        for (pcre2_code* c : codes) pcre2_code_free(c);
    }
};

RegexSplitter::RegexSplitter(const std::vector<std::string>& regexes)
    : impl_(std::make_unique<Impl>()) {
    for (const std::string& re : regexes) {
        const std::string pattern = expand_whitespace(re);
        int err = 0;
        PCRE2_SIZE err_off = 0;
        pcre2_code* code =
            pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            fail("pre-tokenizer regex does not compile at offset {}: {} ({})", err_off,
                 reinterpret_cast<const char*>(msg), re);
        }
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back if absent
        impl_->codes.push_back(code);
    }
}

RegexSplitter::~RegexSplitter() = default;

std::vector<std::string> RegexSplitter::split(std::string_view text) const {
    // Decode leniently as llama.cpp does; `canon` is the re-encoded text the pieces come from,
    // `subject` the same bytes with code points PCRE2 rejects (surrogates, > U+10FFFF)
    // replaced by private-use characters of equal length, so byte offsets agree.
    const std::vector<uint32_t> cps = utf8_decode_lenient(text);
    std::string canon, subject;
    canon.reserve(text.size());
    subject.reserve(text.size());
    for (uint32_t cp : cps) {
        utf8_append(canon, cp);
        const bool bad = (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF;
        utf8_append(subject, !bad ? cp : (cp > 0xFFFF ? 0xF0000 : 0xE000));
    }

    struct Span {
        size_t start, len;
    };
    std::vector<Span> spans;
    if (!canon.empty()) spans.push_back({0, canon.size()});

    pcre2_match_data* md = pcre2_match_data_create(16, nullptr);
    if (!md) fail("out of memory creating regex match data");
    try {
        for (pcre2_code* code : impl_->codes) {
            std::vector<Span> next;
            next.reserve(spans.size() * 2);
            for (const Span& sp : spans) {
                const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data() + sp.start);
                size_t pos = 0, last = 0;
                while (pos <= sp.len) {
                    const int rc =
                        pcre2_match(code, subj, sp.len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
                    if (rc == PCRE2_ERROR_NOMATCH) break;
                    if (rc < 0) fail("pre-tokenizer regex failed on the text (PCRE2 error {})", rc);
                    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
                    const size_t m0 = ov[0], m1 = ov[1];
                    if (m0 > last) next.push_back({sp.start + last, m0 - last});
                    if (m1 > m0) {
                        next.push_back({sp.start + m0, m1 - m0});
                        pos = m1;
                    } else {  // empty match: step over one character
                        pos = m0 < sp.len ? m0 + utf8_lead_len(subject[sp.start + m0]) : m0 + 1;
                    }
                    last = m1 > m0 ? m1 : m0;
                }
                if (last < sp.len) next.push_back({sp.start + last, sp.len - last});
            }
            spans.swap(next);
        }
    } catch (...) {
        pcre2_match_data_free(md);
        throw;
    }
    pcre2_match_data_free(md);

    std::vector<std::string> words;
    words.reserve(spans.size());
    for (const Span& sp : spans) words.emplace_back(canon, sp.start, sp.len);
    return words;
}

}  // namespace kvrun
