// The llama.cpp reference logits in ../shared/reference/logits/<model>.jsonl (one prompt a
// line: its tokens, the log-sum-exp and the 10 largest logits at every position, and 48
// greedy tokens with the top-1 minus top-2 gap at each step). Read by test_model and by
// tools/llamacpp-fidelity.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace kvrun {

struct RefPosition {
    double logsumexp = 0;
    std::vector<std::pair<int32_t, double>> top;  // the 10 largest logits, best first
};

struct RefPrompt {
    std::string text;                    // the prompt
    std::vector<int32_t> tokens;         // prompt with BOS
    std::vector<RefPosition> positions;  // [n_tokens]
    std::vector<int32_t> greedy;         // [48]
    std::vector<double> gaps;            // [48] top-1 minus top-2 logit at each greedy step
};

// Throws Error when the file cannot be read or a line is not a reference record.
inline std::vector<RefPrompt> load_reference_logits(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read {}", path.string());
    std::vector<RefPrompt> out;
    std::string line;
    try {
        while (std::getline(in, line)) {
            if (line.empty()) continue;
            // greedy_text may hold invalid UTF-8 (a token split mid-character); only the
            // numbers (and the ASCII prompts) matter.
            for (char& ch : line)
                if (static_cast<unsigned char>(ch) >= 0x80) ch = '?';
            const auto j = nlohmann::json::parse(line);
            RefPrompt p;
            p.text = j.at("prompt").get<std::string>();
            p.tokens = j.at("tokens").get<std::vector<int32_t>>();
            for (const auto& pos : j.at("positions")) {
                RefPosition r;
                r.logsumexp = pos.at("logsumexp").get<double>();
                for (const auto& t : pos.at("top"))
                    r.top.emplace_back(t[0].get<int32_t>(), t[1].get<double>());
                p.positions.push_back(std::move(r));
            }
            p.greedy = j.at("greedy").get<std::vector<int32_t>>();
            p.gaps = j.at("greedy_top2_gap").get<std::vector<double>>();
            out.push_back(std::move(p));
        }
    } catch (const nlohmann::json::exception& e) {
        fail("{}: line {}: {}", path.string(), out.size() + 1, e.what());
    }
    return out;
}

}  // namespace kvrun
