// The command-line modes: each adds its subcommand to the root CLI11 app and runs it.
// A mode's callback stores its exit code in `exit_code`; errors are thrown as kvrun::Error.
#pragma once

#include "modes/cli_fwd.h"

namespace kvrun {

void add_info_command(CLI::App& root, int& exit_code);
void add_tokenize_command(CLI::App& root, int& exit_code);
void add_run_command(CLI::App& root, int& exit_code);
void add_batch_command(CLI::App& root, int& exit_code);
void add_chat_command(CLI::App& root, int& exit_code);
void add_bench_command(CLI::App& root, int& exit_code);
void add_perplexity_command(CLI::App& root, int& exit_code);
void add_quantize_command(CLI::App& root, int& exit_code);
void add_embedding_command(CLI::App& root, int& exit_code);
void add_imatrix_command(CLI::App& root, int& exit_code);
void add_server_command(CLI::App& root, int& exit_code);
void add_export_lora_command(CLI::App& root, int& exit_code);
void add_gguf_split_command(CLI::App& root, int& exit_code);
void add_cvector_command(CLI::App& root, int& exit_code);

}  // namespace kvrun
