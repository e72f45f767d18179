# Shared by bench/ckpt_background.sh and bench/ckpt_overlap.sh (sourced): the corpus (this
# repository's C sources, byte tokenizer) and the config of the periodic-save benchmarks (bf16,
# ZeRO stage 2, optimizer on the CPU: the configuration whose periodic saves go to the background).
#   ckpt_bench_setup DIR ZOFF     -> DIR/corpus_train.bin, DIR/cfg.json (DIR created afresh)
ckpt_bench_setup() {
  local dir="$1" zoff="$2" src
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  rm -rf "$dir"; mkdir -p "$dir"
  cat "$src"/src/*/*.c > "$dir/corpus.txt"
  "$zoff" tokenize --tokenizer byte --quiet --output-prefix "$dir/corpus" "$dir/corpus.txt" >/dev/null 2>&1 || return 1
  cat > "$dir/cfg.json" <<'EOC'
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
EOC
}
