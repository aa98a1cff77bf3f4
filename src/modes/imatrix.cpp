// `kvrun imatrix`: llama-imatrix. Runs a calibration text through the model in chunks of
// -c tokens (BOS first, as perplexity does), collecting every weight matrix's mean squared
// input activations through the backend's matmul observer (the CUDA backend copies them to
// the host; its experts cannot be observed), and writes them for `quantize --imatrix`.
#include "imatrix.h"

#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>

#include "common.h"
#include "kv_block_table.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "sampler.h"
#include "text_input.h"

namespace kvrun {
namespace {

struct ImatrixOptions {
    ModelOptions model;
    std::string file, output = "imatrix.gguf";
    std::vector<std::string> in_files;  // --in-file: imatrices to add
    int64_t chunks = -1, first_chunk = 0;
    int64_t output_frequency = 10;  // save every this many chunks (0: only at the end)
    bool process_output = false;
};

// --in-file without -f: the given imatrices added up (shapes checked against the model).
int merge_only(const ImatrixOptions& o) {
    GgufFile model = GgufFile::open(o.model.model);
    ImatrixCollector collector(model, o.process_output);
    for (const std::string& f : o.in_files) collector.add(load_imatrix(f));
    save_imatrix(collector.result(), o.output);
    fmt::print(stderr, "imatrix: {} files added: {} matrices, {} chunks -> {}\n", o.in_files.size(),
               collector.result().entries.size(), collector.result().chunks, o.output);
    return 0;
}

int run_imatrix(ImatrixOptions o) {
    if (o.file.empty()) {
        if (o.in_files.empty())
            throw Error("nothing to do: give a calibration text (-f)",
                        "or --in-file FILE (repeatable) to add imatrix files up");
        return merge_only(o);
    }
    if (o.model.n_ctx <= 0) o.model.n_ctx = 512;  // llama-imatrix's chunk size
    const std::string text = read_file_text(o.file);
    utf8_require_valid(text, o.file);
    LoadedModel m = load_model(o.model, 1);
    install_interrupt_handler();
    const int32_t n_ctx = o.model.n_ctx, n_batch = std::min(o.model.n_batch, n_ctx);
    const Tokenizer& tok = *m.tokenizer;
    const std::vector<TokenId> tokens = tok.encode(text, tok.bos() >= 0);
    const int64_t available = int64_t(tokens.size()) / n_ctx - o.first_chunk;
    if (available <= 0)
        throw Error(fmt::format("{}: {} tokens hold no chunk of {} after chunk {}", o.file,
                                tokens.size(), n_ctx, o.first_chunk),
                    "use a longer text, a smaller -c or a smaller --chunk");
    const int64_t n_chunks = o.chunks > 0 ? std::min(o.chunks, available) : available;

    ImatrixCollector collector(*m.file, o.process_output);
    collector.result().chunk_size = n_ctx;
    for (const std::string& f : o.in_files) collector.add(load_imatrix(f));
    const int64_t earlier_chunks = collector.result().chunks;
    Backend& backend = *m.backend;
    if (!backend.set_matmul_observer([&](const void* w, int64_t n_in, const float* x,
                                         int64_t rows) { collector.observe(w, n_in, x, rows); }))
        throw Error(fmt::format("the {} backend cannot show this model's weight products (a "
                                "mixture of experts routes them on the device)",
                                m.device),
                    "give --device cpu");
    fmt::print(stderr, "imatrix: {} on {} ({}): {} chunks of {} tokens from chunk {}\n",
               o.model.model, o.file, m.device, n_chunks, n_ctx, o.first_chunk);

    KvBlockTable table = kv_table_for(backend);
    const int64_t n_vocab = backend.config().n_vocab;
    std::vector<float> logits;
    double nll = 0;
    int64_t scored = 0;
    const auto start = std::chrono::steady_clock::now();
    Imatrix& im = collector.result();
    im.chunk_size = n_ctx;
    im.datasets.push_back(o.file);
    auto save = [&](int64_t done) {  // what the first `done` chunks gave
        im.chunks = earlier_chunks + done;
        save_imatrix(im, o.output);
    };
    int64_t done = 0;
    for (int64_t c = 0; c < n_chunks; ++c) {
        if (interrupt_flag()) break;  // a chunk is never cut: the sums stay whole chunks
        std::vector<TokenId> chunk(tokens.begin() + (o.first_chunk + c) * n_ctx,
                                   tokens.begin() + (o.first_chunk + c + 1) * n_ctx);
        if (tok.bos() >= 0) chunk[0] = tok.bos();
        const SeqId seq = table.create_sequence();
        for (int32_t at = 0; at < n_ctx; at += n_batch) {
            const int32_t n = std::min(n_batch, n_ctx - at);
            if (!table.append(seq, n, chunk.data() + at))
                fail("KV pool exhausted during imatrix (pool too small for -c {})", n_ctx);
            kv_apply_pending(table, backend);
            ForwardBatch fb;
            fb.add_sequence(table, seq, at, n);
            for (int32_t i = 0; i < n; ++i)  // the second half scores the perplexity shown
                if (at + i >= n_ctx / 2 && at + i < n_ctx - 1) fb.logit_rows.push_back(i);
            if (fb.logit_rows.empty()) fb.logit_rows.push_back(n - 1);
            logits.resize(fb.logit_rows.size() * size_t(n_vocab));
            backend.forward(fb, logits.data());
            for (size_t r = 0; r < fb.logit_rows.size(); ++r) {
                const int32_t pos = at + fb.logit_rows[r];
                if (pos < n_ctx / 2 || pos >= n_ctx - 1) continue;
                nll -= token_logprobs(logits.data() + r * size_t(n_vocab), int(n_vocab),
                                      chunk[size_t(pos) + 1], 0)
                           .chosen.logprob;
                ++scored;
            }
        }
        table.free_sequence(seq);
        done = c + 1;
        fmt::print(stderr, "[{}]{:.4f}{}", done,
                   std::exp(nll / double(std::max<int64_t>(1, scored))),
                   done < n_chunks ? "," : "\n");
        if (o.output_frequency > 0 && done % o.output_frequency == 0 && done < n_chunks) {
            save(done);
            fmt::print(stderr, "\nimatrix: saved {} chunks to {}\n", done, o.output);
        }
    }
    backend.set_matmul_observer({});
    const double secs = seconds_since(start);
    if (done < n_chunks) {  // Ctrl-C
        if (done > 0) save(done);
        fmt::print(stderr, "\nkvrun: interrupted after {} of {} chunks{}\n", done, n_chunks,
                   done > 0 ? fmt::format("; {} holds them", o.output) : "");
        return 130;
    }
    save(done);
    fmt::print(stderr, "imatrix: {} matrices, {} chunks, final PPL {:.4f}, {:.1f} s -> {}\n",
               im.entries.size(), n_chunks, std::exp(nll / double(std::max<int64_t>(1, scored))),
               secs, o.output);
    return 0;
}

}  // namespace

void add_imatrix_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<ImatrixOptions>();
    CLI::App* cmd = root.add_subcommand(
        "imatrix",
        "Compute an importance matrix from a calibration text (llama-imatrix) for "
        "`quantize --imatrix`");
    add_model_options(cmd, o->model);
    cmd->add_option("-f,--file", o->file, "Calibration text")->check(CLI::ExistingFile);
    cmd->add_option("--in-file", o->in_files,
                    "Add this imatrix (.gguf or .dat) to the result (repeatable; without -f the "
                    "files are only added up)")
        ->check(CLI::ExistingFile);
    cmd->add_option("-o,--output,--output-file", o->output,
                    "Output: llama.cpp's GGUF imatrix (*.gguf) or its .dat layout (any other name)")
        ->capture_default_str();
    cmd->add_option("--chunks", o->chunks, "Chunks of -c tokens to process (default: all)");
    cmd->add_option("--chunk", o->first_chunk, "Start at this chunk (skip the ones before)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--output-frequency", o->output_frequency,
                    "Save the imatrix every N chunks (0: only at the end; Ctrl-C saves the "
                    "chunks done)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_flag("--process-output", o->process_output,
                  "Also collect output.weight's inputs (llama-imatrix leaves it out)");
    cmd->footer(
        "-c is the chunk size (default 512). On the GPU, each observed product's inputs are "
        "copied to the host (passes run without CUDA graphs); mixture-of-experts models need "
        "--device cpu.");
    cmd->callback([o, &exit_code] { exit_code = run_imatrix(*o); });
}

}  // namespace kvrun
