# Shared by the tests/cli_*.sh scripts (sourced, not run): the pass/fail counters and their
# three helpers. Each script prints "$pass passed, $fail failed" last and exits non-zero on a
# failure.
#   ok NAME          a check that passed
#   bad NAME         a check that failed
#   check NAME EXPR  ok or bad as EXPR (evaluated) succeeds
pass=0; fail=0
ok()    { echo "ok   - $1"; pass=$((pass + 1)); }
bad()   { echo "FAIL - $1"; fail=$((fail + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
# The Python with Debian's python3-torch (under /usr/bin, not the first python3 on PATH).
PY=$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)
#   byte_corpus SRCDIR DIR   DIR/corpus_train.bin and DIR/corpus_val.bin: zoff's own C sources
#                            as byte tokens (a small corpus every test machine has); needs $ZOFF
byte_corpus() {
    cat "$1"/src/*/*.c > "$2/corpus.txt"
    "$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$2/corpus" "$2/corpus.txt" >/dev/null 2>&1
}
#   fixed_corpus SRCDIR DIR  the same from text that never changes with the code (the shipped GPT-2 BPE
#                            tables, data/gpt2): for tests that compare trajectories within a tolerance,
#                            which a corpus of the sources made depend on every edit of them
fixed_corpus() {
    cat "$1"/data/gpt2/vocab.bpe "$1"/data/gpt2/encoder.json > "$2/corpus.txt"
    "$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$2/corpus" "$2/corpus.txt" >/dev/null 2>&1
}
