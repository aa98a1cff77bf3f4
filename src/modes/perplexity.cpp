// `kvrun perplexity`: llama.cpp-compatible perplexity of a model on a text file, and KL
// divergence against a saved run (to judge a quantized KV cache or weights against f16).
#include "perplexity.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "choice_eval.h"
#include "modes/model_options.h"
#include "modes/modes.h"
#include "text_input.h"

namespace kvrun {
namespace {

struct PplOptions {
    ModelOptions model;
    std::string file;
    int32_t chunks = -1;
    std::string kld_save, kld_base;
    // llama.cpp's spelling: --kl-divergence-base FILE saves there, and with --kl-divergence
    // compares against it.
    std::string kl_divergence_base;
    bool kl_divergence = false;
    bool hellaswag = false;
    int64_t hellaswag_tasks = 400;
    bool multiple_choice = false;
    int64_t multiple_choice_tasks = 0;  // 0: all
    bool winogrande = false;
    int64_t winogrande_tasks = 0;  // 0: all
};

// The model for a task score: -c defaults to 512, the KV pool holds n_seq sequences (a
// question's candidates at once), and Ctrl-C is caught (the per-task callbacks check it).
LoadedModel load_task_model(PplOptions& o, int32_t n_seq) {
    if (o.model.n_ctx <= 0) o.model.n_ctx = 512;
    LoadedModel m = load_model(o.model, n_seq);
    install_interrupt_handler();
    return m;
}

// Tokens per forward pass of a task score.
int32_t task_batch(const PplOptions& o) {
    return std::min(o.model.n_batch, o.model.n_ctx);
}

// --winogrande: llama-perplexity's Winogrande score on its CSV: one line per task (running
// accuracy, both scores, the choice and the answer), then the final score.
int run_winogrande(PplOptions o) {
    const std::string text = read_file_text(o.file);
    size_t skipped = 0;
    const std::vector<WinograndeTask> all = winogrande_parse(text, &skipped);
    if (all.empty())
        throw Error(fmt::format("{}: no Winogrande tasks ({} lines skipped)", o.file, skipped),
                    "one task per line: index,sentence with _,choice1,choice2,answer (1 or 2)");
    const std::vector<WinograndeTask> tasks =
        winogrande_select(all, static_cast<size_t>(o.winogrande_tasks));
    LoadedModel m = load_task_model(o, 2);
    fmt::print(stderr, "winogrande: {} on {} ({}): {} of {} tasks{}{}\n", o.model.model, o.file,
               m.device, tasks.size(), all.size(),
               tasks.size() < all.size() ? ", drawn at random (seed 1)" : "",
               skipped ? fmt::format("; {} lines that are not tasks skipped", skipped) : "");
    const WinograndeScore s =
        winogrande_run(*m.backend, *m.tokenizer, tasks, task_batch(o),
                       [&](size_t i, const WinograndeTaskResult& r, const WinograndeScore& sc) {
                           if (interrupt_flag()) throw Error("interrupted");
                           fmt::print("{}\t{:.4f}\t{:10.6f}  {:10.6f}  {}  {}\n", i + 1, sc.acc,
                                      r.score[0], r.score[1], r.chosen, tasks[i].answer);
                           std::fflush(stdout);
                       });
    fmt::print("Final Winogrande score({} tasks): {:.4f} +/- {:.4f}\n", s.n_tasks, s.acc, s.sigma);
    return 0;
}

// --multiple-choice: llama-perplexity's score on its binary multiple-choice files (ARC, MMLU,
// TruthfulQA): one line per task with the running accuracy, then the result and what random
// picks would get.
int run_multiple_choice(PplOptions o) {
    const std::string bytes = read_file_text(o.file);
    size_t n_in_file = 0;
    const std::vector<ChoiceTask> tasks = multiple_choice_load(
        bytes, o.file, static_cast<size_t>(o.multiple_choice_tasks), &n_in_file);
    size_t most = 1;
    for (const ChoiceTask& t : tasks) most = std::max(most, t.answers.size());
    LoadedModel m = load_task_model(o, static_cast<int32_t>(std::min<size_t>(most, 16)));
    fmt::print(stderr, "multiple choice: {} on {} ({}): {} of {} tasks{}\n", o.model.model, o.file,
               m.device, tasks.size(), n_in_file,
               tasks.size() < n_in_file ? ", drawn at random (seed 1)" : "");
    fmt::print("task\tacc_norm\n");
    const ChoiceScore s =
        multiple_choice_run(*m.backend, *m.tokenizer, tasks, task_batch(o),
                            [&](size_t i, const ChoiceTaskResult&, const ChoiceScore& sc) {
                                if (interrupt_flag()) throw Error("interrupted");
                                fmt::print("{}\t{:.8f}\n", i + 1, sc.acc);
                                std::fflush(stdout);
                            });
    fmt::print("Final result: {:.4f} +/- {:.4f}\nRandom chance: {:.4f} +/- {:.4f}\n", s.acc,
               s.acc_sigma, s.chance, s.chance_sigma);
    return 0;
}

// --hellaswag: llama-perplexity's HellaSwag score (acc_norm) on a task file, one line per task
// with the running accuracy and its 95% interval, as llama.cpp prints them.
int run_hellaswag(PplOptions o) {
    const std::string text = read_file_text(o.file);
    utf8_require_valid(text, "'" + o.file + "'");
    const std::vector<HellaswagTask> all = hellaswag_parse(text, o.file);
    const std::vector<HellaswagTask> tasks =
        hellaswag_select(all, static_cast<size_t>(o.hellaswag_tasks));
    LoadedModel m = load_task_model(o, 4);  // the four endings of a task at once
    fmt::print(stderr, "hellaswag: {} on {} ({}): {} of {} tasks, drawn at random (seed 1)\n",
               o.model.model, o.file, m.device, tasks.size(), all.size());
    fmt::print("task\tacc_norm\t95% confidence interval\n");
    const HellaswagScore s = hellaswag_run(
        *m.backend, *m.tokenizer, tasks, task_batch(o),
        [&](size_t i, const HellaswagTaskResult&, const HellaswagScore& sc) {
            if (interrupt_flag()) throw Error("interrupted");
            fmt::print("{}\t{:.8f}%\t[{:.4f}%, {:.4f}%]\n", i + 1, sc.acc, sc.lo, sc.hi);
            std::fflush(stdout);
        });
    fmt::print("Final HellaSwag: acc_norm = {:.4f}% [{:.4f}%, {:.4f}%] over {} tasks\n", s.acc,
               s.lo, s.hi, s.n_tasks);
    return 0;
}

// llama-perplexity's three blocks of comparison statistics (its layout and names).
void print_comparison(const PerplexityResult& r) {
    fmt::print(
        "\n====== Perplexity statistics ======\n"
        "Mean PPL(Q)                   : {:10.6f} ± {:10.6f}\n"
        "Mean PPL(base)                : {:10.6f} ± {:10.6f}\n"
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2f}%\n"
        "Mean ln(PPL(Q)/PPL(base))     : {:10.6f} ± {:10.6f}\n"
        "Mean PPL(Q)/PPL(base)         : {:10.6f} ± {:10.6f}\n"
        "Mean PPL(Q)-PPL(base)         : {:10.6f} ± {:10.6f}\n",
        r.ppl, r.ppl_stderr, r.base_ppl, r.base_ppl_stderr, 100 * r.nll_correlation, r.ln_ratio,
        r.ln_ratio_stderr, r.ppl_ratio, r.ppl_ratio_stderr, r.ppl - r.base_ppl, r.ppl_delta_stderr);
    auto label = [](double q, const char* what) {
        if (q == 1.0) return fmt::format("Maximum {}", what);
        if (q == 0.0) return fmt::format("Minimum {}", what);
        if (q == 0.5) return fmt::format("Median  {}", what);
        return fmt::format("{:4.1f}%   {}", 100 * q, what);
    };
    fmt::print("\n====== KL divergence statistics ======\n");
    fmt::print("Mean    KLD: {:10.6f} ± {:10.6f}\n", r.kld_mean, r.kld_stderr);
    for (const auto& [q, v] : r.kld_quantiles) fmt::print("{}: {:10.6f}\n", label(q, "KLD"), v);
    fmt::print("\n====== Token probability statistics ======\n");
    fmt::print("Mean    Δp: {:8.3f} ± {:5.3f} %\n", 100 * r.dp_mean, 100 * r.dp_stderr);
    for (const auto& [q, v] : r.dp_quantiles) fmt::print("{}: {:8.3f}%\n", label(q, "Δp"), 100 * v);
    fmt::print("RMS Δp    : {:8.3f} %\n", 100 * r.dp_rms);
    fmt::print("Same top p: {:8.3f} ± {:5.3f} %\n\n", 100 * r.top1_agreement, 100 * r.top1_stderr);
}

int run_perplexity(PplOptions o) {
    if (!o.kl_divergence_base.empty())
        (o.kl_divergence ? o.kld_base : o.kld_save) = o.kl_divergence_base;
    std::string text = read_file_text(o.file);
    utf8_require_valid(text, "'" + o.file + "'");
    if (o.model.n_ctx <= 0) o.model.n_ctx = 512;
    PerplexityOptions po;
    po.n_ctx = o.model.n_ctx;
    po.n_batch = o.model.n_batch;  // -b holding several chunks runs them in one pass
    po.n_chunks = o.chunks;
    po.kld_save = o.kld_save;
    po.kld_base = o.kld_base;
    const int32_t n_par = std::max(1, po.n_batch / po.n_ctx);
    LoadedModel m = load_model(o.model, n_par);
    install_interrupt_handler();
    fmt::print(stderr, "perplexity: {} on {} ({}), -c {} -b {}{}\n{}\n", o.model.model, o.file,
               m.device, po.n_ctx, po.n_batch,
               n_par > 1 ? fmt::format(" ({} chunks per pass)", n_par) : "",
               kv_cache_summary(*m.backend, o.model));
    auto progress = [&](int32_t done, int32_t total, double ppl, double secs) {
        if (interrupt_flag()) throw Error("interrupted");
        const double eta = done > 0 ? secs / done * (total - done) : 0;
        const int width = 30, filled = total > 0 ? width * done / total : width;
        fmt::print(stderr, "\r[{}{}] chunk {}/{}  PPL {:.4f}  ETA {:.0f}s   ",
                   std::string(filled, '#'), std::string(width - filled, '.'), done, total, ppl,
                   eta);
        if (done == total) fmt::print(stderr, "\n");
    };
    PerplexityResult r = perplexity_run(*m.backend, *m.tokenizer, text, po, progress);
    for (size_t i = 0; i < r.chunk_ppl.size(); ++i)
        fmt::print("[{}]{:.4f},", i + 1, r.chunk_ppl[i]);
    fmt::print("\n");
    if (r.has_kld) {
        fmt::print("KL divergence vs {}: mean {:.6f} +/- {:.6f}, p99 {:.6f}, max {:.6f}\n",
                   o.kld_base, r.kld_mean, r.kld_stderr, r.kld_p99, r.kld_max);
        fmt::print("top-1 agreement: {:.3f}%\n", 100.0 * r.top1_agreement);
        fmt::print("PPL base {:.4f} -> {:.4f}: delta {:+.4f} ({:+.3f}%)\n", r.base_ppl, r.ppl,
                   r.ppl - r.base_ppl, 100.0 * (r.ppl - r.base_ppl) / r.base_ppl);
        print_comparison(r);
    }
    if (!o.kld_save.empty()) fmt::print(stderr, "saved log-probabilities to {}\n", o.kld_save);
    fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_stderr);
    return 0;
}

}  // namespace

void add_perplexity_command(CLI::App& root, int& exit_code) {
    auto o = std::make_shared<PplOptions>();
    CLI::App* cmd = root.add_subcommand(
        "perplexity",
        "Perplexity of a model on a text file (llama.cpp's method), or KL divergence "
        "against a saved run");
    add_model_options(cmd, o->model);
    cmd->add_option("-f,--file", o->file, "Text file to evaluate (e.g. wiki.test.raw)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--chunks", o->chunks, "Evaluate at most this many chunks (-1: all)")
        ->check(at_least(-1))
        ->capture_default_str();
    auto* kld_save =
        cmd->add_option("--kld-save", o->kld_save, "Save per-token log-probabilities to this file");
    auto* kld = cmd->add_option("--kld", o->kld_base,
                                "Compare against log-probabilities saved with --kld-save");
    auto* hs = cmd->add_flag("--hellaswag", o->hellaswag,
                             "Score HellaSwag tasks from -f (llama.cpp's hellaswag_val_full.txt "
                             "layout) instead of perplexity");
    cmd->add_option("--hellaswag-tasks", o->hellaswag_tasks,
                    "Tasks to score, drawn at random with seed 1 as llama.cpp does")
        ->check(at_least(1))
        ->capture_default_str()
        ->needs(hs);
    auto* klb = cmd->add_option("--kl-divergence-base", o->kl_divergence_base,
                                "llama.cpp's spelling: save the log-probabilities to this file "
                                "(as --kld-save), or with --kl-divergence compare against it "
                                "(as --kld)");
    cmd->add_flag("--kl-divergence", o->kl_divergence,
                  "Compare against --kl-divergence-base (llama.cpp's spelling of --kld)")
        ->needs(klb);
    klb->excludes(kld)->excludes(kld_save);
    hs->excludes(kld)->excludes(kld_save)->excludes(klb);
    auto* mc = cmd->add_flag("--multiple-choice", o->multiple_choice,
                             "Score multiple-choice tasks from -f (llama.cpp's binary ARC, MMLU, "
                             "TruthfulQA files) instead of perplexity");
    cmd->add_option("--multiple-choice-tasks", o->multiple_choice_tasks,
                    "Tasks to score (0: all, in file order; else drawn at random with seed 1)")
        ->check(at_least(0))
        ->capture_default_str()
        ->needs(mc);
    mc->excludes(kld)->excludes(kld_save)->excludes(klb)->excludes(hs);
    auto* wg = cmd->add_flag("--winogrande", o->winogrande,
                             "Score Winogrande tasks from -f (llama.cpp's CSV) instead of "
                             "perplexity");
    cmd->add_option("--winogrande-tasks", o->winogrande_tasks,
                    "Tasks to score (0: all, in file order; else drawn at random with seed 1)")
        ->check(at_least(0))
        ->capture_default_str()
        ->needs(wg);
    wg->excludes(kld)->excludes(kld_save)->excludes(klb)->excludes(hs)->excludes(mc);
    cmd->footer(
        "-c sets the chunk length (default 512); each chunk scores its last n_ctx/2 "
        "predictions. The last stdout line is `Final estimate: PPL = <ppl> +/- <err>`.");
    cmd->callback([o, &exit_code] {
        exit_code = o->hellaswag         ? run_hellaswag(*o)
                    : o->multiple_choice ? run_multiple_choice(*o)
                    : o->winogrande      ? run_winogrande(*o)
                                         : run_perplexity(*o);
    });
}

}  // namespace kvrun
