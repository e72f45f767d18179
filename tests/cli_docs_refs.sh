#!/usr/bin/env bash
# The docs name only what exists: every path under src/, include/, tests/, scripts/, bench/ that
# docs/*.md and README.md name is in the tree, and every zoff_* name they use is declared or
# defined in src/ or include/ (docs/architecture.md describes the code as it is; a renamed or
# removed function, type or file must take its mentions with it). Reported as DOC:LINE: REF.
#   paths        a word starting with src/ include/ tests/ scripts/ bench/ docs/ fuzz/ (backticked or not;
#                trailing . , : ; dropped); one with '*' or a capitalised placeholder folder
#                (fuzz/corpus/NAME/) must match at least one file
#   zoff_NAME    every lowercase zoff_ word (backticked or not): declared in the sources with
#                the comments taken out (after a type word, '*', 'struct', 'enum', 'union',
#                '#define', '}' or '(*'), or a string the code uses ("zoff_grad_buckets": a config
#                key); zoff_NAME_* needs one such name with that prefix; zoff_T.field also needs
#                the word `field` in the code
#   ZOFF_NAME    every uppercase ZOFF_ word (macros, environment variables, CMake options): a
#                word in src/, include/, tests/, scripts/, bench/, fuzz/ or CMakeLists.txt
#   `test_X`     a backticked test name: a ctest name (tests/test_X.c) or a word in tests/
#   `name.c`     a backticked source file named without its folder (`engine_impl.h`): a file of
#                the tree whose path ends with it
#   Layers       docs/architecture.md's "Layers" table against the #includes: each src/ folder
#                uses only the folders of the rows above it (a public header belongs to the row
#                that lists it), and every src/ folder and include/zoff/ header has a row
# First the checker is shown to fail on a page with made-up references (and to pass its real
# ones) and on a Layers table with rows swapped or missing, then it runs over the real pages.
# grep, sed, awk and two perl passes: a few seconds.
# Usage: cli_docs_refs.sh ZOFF SRCDIR   (ZOFF unused: the docs are checked against the sources)
set -u
SRC=$(cd "$2" && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/zoff-docs-refs-XXXXXX")
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check
if ! command -v perl >/dev/null; then echo "skip: no perl to take the comments out of the sources"; exit 77; fi
cd "$SRC" || exit 1

# strip FILE...: the sources without comments (strings and character literals kept whole, so that a
# "/*" or "//" inside one is not taken for a comment), file by file
strip() {
  perl -0777 -ne 's{("(?:\\.|[^"\\\n])*"|'"'"'(?:\\.|[^'"'"'\\\n])*'"'"')|/\*.*?\*/|//[^\n]*}{defined $1 ? $1 : " "}gse; print' "$@"
}
# declared FILE: the zoff_ names that FILE (stripped) declares or defines, and those in its strings
declared() {
  perl -0777 -ne '
    while (/(#\s*define\s+|\b(?:struct|enum|union)\s+|\(\s*\*\s*|\}\s*|\b(\w+)[\s*]+)(zoff_\w+)/g) {
      my ($kw, $name, $at) = ($2, $3, $-[3]);
      print "$name\n" unless defined $kw && $kw =~ /^(return|else|case|goto|sizeof|do)$/;
      pos($_) = $at; # the name itself may be the type word of the next declaration
    }
    while (/"([^"\\\n]*)"/g) { print "$1\n" for $1 =~ /\b(zoff_\w+)/g; }' "$1" | sort -u
}
mapfile -d '' sources < <(find src include -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0)
strip "${sources[@]}" > "$W/code.txt"
declared "$W/code.txt" > "$W/declared.txt"
grep -ohE '\b[A-Za-z_][A-Za-z0-9_]*\b' "$W/code.txt" | sort -u > "$W/words.txt"
grep -rhoE --exclude-dir=.git --exclude=cli_docs_refs.sh '\bZOFF_[A-Z0-9_]+' src include tests scripts bench fuzz CMakeLists.txt 2>/dev/null |
  sort -u > "$W/upper.txt"

find src include tests scripts bench fuzz -type f > "$W/files.txt"
# the tests' names: ctest's (tests/test_X.c) and the test functions in them
{ grep -rhoE --exclude=cli_docs_refs.sh '\btest_[a-z0-9_]+' tests scripts CMakeLists.txt; sed -nE 's#^tests/(test_[a-z0-9_]+)\.c$#\1#p' "$W/files.txt"; } |
  sort -u > "$W/tests.txt"

# scan DOC...: one line per reference that does not resolve, "DOC:LINE: `REF`: why"
scan() {
  local doc
  for doc in "$@"; do
    # paths: not inside another path or word (../shared/src/x, https://host/src/x, my_src/x)
    grep -noE '(^|[^A-Za-z0-9_./~-])(src|include|tests|scripts|bench|docs|fuzz)/[A-Za-z0-9_.*/+-]*' "$doc" |
      # "LINE REF GLOB": in GLOB a placeholder folder (fuzz/corpus/NAME/: a capitalised word) is '*'
      sed -E 's/^([0-9]+):[^a-z]*/\1 /; s/[.,:;]+$//; h; s/^[0-9]+ //; :a; s#(^|/)[A-Z][A-Z0-9_]*(/|$)#\1*\2#; ta; H; x; s/\n/ /' |
      while read -r line ref glob; do
        case "$glob" in
          *'*'*) compgen -G "$glob" >/dev/null || echo "$doc:$line: \`$ref\`: matches no file" ;;
          *) [ -e "$ref" ] || echo "$doc:$line: \`$ref\`: no such file or folder" ;;
        esac
      done
    # a backticked source file named without its folder (`engine_impl.h`, `cpu/cpu_kernels.c`): a file
    # of the tree whose path ends with it
    grep -noE '`[A-Za-z0-9_./-]+\.(c|h|cu|cuh|cpp|hpp)`' "$doc" | tr -d '`' | tr ':' ' ' | while read -r line ref; do
        case "$ref" in src/*|include/*|tests/*|scripts/*|bench/*) continue ;; esac
        grep -qE "(^|/)${ref//./\\.}\$" "$W/files.txt" || echo "$doc:$line: \`$ref\`: no file of that name in the tree"
      done
    # a backticked test name (`test_comm`, `test_bucket_accumulation`): a ctest name or a word in tests/
    grep -noE '`test_[a-z0-9_]+`' "$doc" | tr -d '`' | tr ':' ' ' | while read -r line ref; do
        grep -qx "$ref" "$W/tests.txt" || echo "$doc:$line: \`$ref\`: no test of that name in tests/"
      done
    grep -noE '(^|[^A-Za-z0-9_])zoff_[A-Za-z0-9_]*(\*|\.[A-Za-z_][A-Za-z0-9_]*)?' "$doc" |
      sed -E 's/^([0-9]+):[^z]*/\1 /' | while read -r line ref; do
        name=${ref%%[.*]*}
        case "$ref" in
          *'*'|*_) grep -q "^$name" "$W/declared.txt" ||
                  echo "$doc:$line: \`$ref\`: no name with this prefix is declared in src/ or include/" ;;
          *) if ! grep -qx "$name" "$W/declared.txt"; then
               echo "$doc:$line: \`$name\`: not declared or defined in src/ or include/"
             elif [ "$ref" != "$name" ] && ! grep -qx "${ref#*.}" "$W/words.txt"; then
               echo "$doc:$line: \`$ref\`: no \`${ref#*.}\` in src/ or include/"
             fi ;;
        esac
      done
    grep -noE '(^|[^A-Za-z0-9_])ZOFF_[A-Z0-9_]*\*?' "$doc" |
      sed -E 's/^([0-9]+):[^Z]*/\1 /' | while read -r line ref; do
        case "$ref" in
          *'*'|*_) grep -q "^${ref%\*}" "$W/upper.txt" || echo "$doc:$line: \`$ref\`: no such name in the tree" ;;
          *) grep -qx "$ref" "$W/upper.txt" || echo "$doc:$line: \`$ref\`: not in src/, include/, tests/, scripts/, bench/, fuzz/ or CMakeLists.txt" ;;
        esac
      done
  done
}

# layers DOC: docs/architecture.md's "Layers" table against the #includes: a layer (row `src/X`,
# its public headers in the second column) uses only the layers above it, and every src/ folder
# and include/zoff/ header is in the table. One line per breach, "DOC:LINE: what".
layers() {
  local doc=$1
  { awk '/^## Layers/ {on = 1; next} /^## / {on = 0}
         on && /^\| `src\/[a-z_]+` \|/ {
           split($0, col, "|"); d = col[2]; gsub(/[ `]|src\//, "", d)
           printf "row %s %d %s", d, NR, d
           h = col[3]; while (match(h, /`[a-z_]+\.h`/)) { printf " %s", substr(h, RSTART + 1, RLENGTH - 4); h = substr(h, RSTART + RLENGTH) }
           print ""
         }' "$doc"
    find src -mindepth 1 -maxdepth 1 -type d -printf 'dir %f\n'
    find include/zoff -name '*.h' -printf 'hdr %f\n'
    for f in $(find src include/zoff -type f | sort); do
      grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$f" | sed -E "s|^([0-9]+):.*\"([^\"]+)\".*|inc $f \\1 \\2|"
    done
  } | awk -v doc="$doc" '
    $1 == "row" { rank[$2] = ++n; line[$2] = $3; for (i = 5; i <= NF; i++) { sub(/\.h$/, "", $i); owner[$i] = $2 }; next }
    $1 == "dir" { if (!($2 in rank)) printf "%s: src/%s: no row of the Layers table\n", doc, $2; next }
    $1 == "hdr" { h = $2; sub(/\.h$/, "", h); if (!(h in owner)) printf "%s: include/zoff/%s: in no row of the Layers table\n", doc, $2; next }
    $1 == "inc" {
      f = $2; split(f, p, "/")
      if (p[1] == "src") me = p[2]; else { h = p[3]; sub(/\.h$/, "", h); me = owner[h] }
      it = $4; split(it, q, "/")
      if (q[1] == "zoff") { h = q[2]; sub(/\.h$/, "", h); them = owner[h] } else if (it ~ /\//) them = q[1]; else them = me
      if (me in rank && them in rank && rank[them] > rank[me])
        printf "%s:%d: %s:%s includes \"%s\" (src/%s), a layer below src/%s in the Layers table\n", doc, line[me], f, $3, it, them, me
    }'
}

# 1. The checker can fail: a page with made-up references next to real ones
mkdir -p "$W/docs"
cat > "$W/docs/fake.md" <<'EOF'
Real: `src/zero/engine.c`, include/zoff/engine.h, `tests/cli_*.sh`, scripts/test.sh and bench/.
Real: `zoff_engine_step`, `zoff_engine_options.init_range`, `zoff_placement_*`, `ZOFF_CKPT_IO`,
`zero_optimization.zoff_grad_buckets`, `zoff_backend_vtable` (a type), ../shared/src/nowhere.c.
Made up: `src/zero/engine2.c`, see include/zoff/nowhere.h and docs/nowhere.md.
Made up: `zoff_engine_stepp`, `zoff_engine_options.init_rangee`, `zoff_placemant_*`, `ZOFF_CKPT_IOO`.
Made up: tests/cli_nowhere_*.sh, `zoff_only_in_a_comment` (a comment is not a declaration), fuzz/NAME/nowhere.
Real: `fuzz/corpus/NAME/`.
Real: `engine_impl.h`, `cpu/cpu_kernels.c`. Made up: `engine_impl2.h`, `cuda/cpu_kernels.c`.
Real: `test_comm`, `test_bucket_accumulation`. Made up: `test_nowhere_at_all`.
EOF
cat > "$W/fake.c" <<'EOF'
/* zoff_only_in_a_comment(void); */ const char *a = "/* not a comment", b = '"'; // zoff_x(void);
static const zoff_backend_vtable zoff_fake_vtable = {0}; int zoff_fake_fn(void); /* "zoff_y" */
typedef struct zoff_fake_s zoff_fake_t; void f(void) { return zoff_called_only(); } // "zoff_z"
const char *key = "zoff_fake_key";
EOF
strip "$W/fake.c" > "$W/fake_code.txt"
got=$(declared "$W/fake_code.txt" | tr '\n' ' ')
check "declared: what a C file declares and its strings, not its comments or calls (got: $got)" \
  "[ '$got' = 'zoff_backend_vtable zoff_fake_fn zoff_fake_key zoff_fake_s zoff_fake_t zoff_fake_vtable ' ]"
scan "$W/docs/fake.md" > "$W/fake.txt"
cat "$W/fake.txt"
for want in '1:' '2:' '3:' '8: `engine_impl.h`' '8: `cpu/cpu_kernels.c`' '7:' '9: `test_comm`' \
            '9: `test_bucket_accumulation`'; do
  check "a real reference on line $want of the made-up page is not reported" "! grep -qF '$W/docs/fake.md:$want' '$W/fake.txt'"
done
for want in '4: `src/zero/engine2.c`' '4: `include/zoff/nowhere.h`' '4: `docs/nowhere.md`' '5: `zoff_engine_stepp`' \
             '5: `zoff_engine_options.init_rangee`' '5: `zoff_placemant_*`' '5: `ZOFF_CKPT_IOO`' \
             '6: `tests/cli_nowhere_*.sh`' '6: `zoff_only_in_a_comment`' '6: `fuzz/NAME/nowhere`' \
             '8: `engine_impl2.h`' '8: `cuda/cpu_kernels.c`' '9: `test_nowhere_at_all`'; do
  check "the made-up reference on line $want is reported with its page and line" \
    "grep -qF '$W/docs/fake.md:$want:' '$W/fake.txt'"
done

# ... and the Layers table: with the rows of src/zero and src/model swapped, src/model's includes of the
# engine's header param_space.h is a layer below; without the src/aio row, src/aio and aio.h are in no row
awk '/^\| `src\/zero` \|/ {z = $0; next} /^\| `src\/model` \|/ {print; print z; next} {print}' docs/architecture.md \
  > "$W/docs/swapped.md"
layers "$W/docs/swapped.md" > "$W/swapped.txt"
grep -v '^| `src/aio` |' docs/architecture.md > "$W/docs/noaio.md"
layers "$W/docs/noaio.md" >> "$W/swapped.txt"
cat "$W/swapped.txt"
check "the Layers table with src/zero below src/model: the model's include of the engine's param_space.h is reported" \
  "grep -qF 'includes \"zoff/param_space.h\" (src/zero), a layer below src/model in the Layers table' '$W/swapped.txt'"
check "the Layers table without its src/aio row: src/aio and include/zoff/aio.h reported" \
  "grep -qF '$W/docs/noaio.md: src/aio: no row' '$W/swapped.txt' && grep -qF '$W/docs/noaio.md: include/zoff/aio.h: in no row' '$W/swapped.txt'"

# 2. The real pages
t0=$(date +%s)
scan docs/*.md README.md > "$W/real.txt"
layers docs/architecture.md >> "$W/real.txt"
t1=$(date +%s)
cat "$W/real.txt"
check "every path and zoff name in docs/*.md and README.md resolves, the Layers table holds ($(wc -l < "$W/real.txt") do not, listed above)" \
  "[ ! -s '$W/real.txt' ]"
check "the pages hold references to check ($(grep -c . "$W/declared.txt") names declared)" \
  "[ \$(grep -ohE '\\bzoff_[a-z0-9_]+' docs/*.md README.md | wc -l) -gt 300 ]"
echo "scan of the real pages: $((t1 - t0)) s"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
