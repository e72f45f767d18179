#!/usr/bin/env bash
# `cmake --install` puts libzoff (static and shared), the public headers, zoff.pc
# and the zoff command under a prefix, and a program outside the tree builds
# against them with pkg-config alone. Usage: cli_install.sh ZOFF SRCDIR (run
# from the build directory, as ctest does).
set -u
BUILD="$(pwd)"
P=$(mktemp -d /tmp/zoff-install-XXXXXX)
trap 'rm -rf "$P"' EXIT
pass=0; fail=0
check() { if eval "$2"; then echo "ok   - $1"; pass=$((pass + 1)); else echo "FAIL - $1"; fail=$((fail + 1)); fi; }

cmake --install "$BUILD" --prefix "$P/usr" >"$P/install.log" 2>&1
check "cmake --install succeeds" "[ \$? -eq 0 ]"
lib="$P/usr/lib"; [ -d "$lib" ] || lib="$P/usr/lib64"; [ -d "$P/usr/lib/x86_64-linux-gnu" ] && lib="$P/usr/lib/x86_64-linux-gnu"
check "static and shared libraries installed" "ls '$lib'/libzoff.a >/dev/null 2>&1 && ls '$lib'/libzoff.so* >/dev/null 2>&1"
check "public headers installed" "[ -f '$P/usr/include/zoff/device.h' ] && [ -f '$P/usr/include/zoff/engine.h' ]"
check "zoff command installed and runs" "'$P/usr/bin/zoff' version >/dev/null 2>&1"
check "zoff.pc installed" "[ -f '$lib/pkgconfig/zoff.pc' ]"

# The installed zoff reads the GPT-2 tables installed beside it (PREFIX/share/zoff, whatever the
# prefix), not only $ZOFF_DATA_DIR, the source tree or /usr/local/share/zoff (before: with any other
# prefix the installed tables were never read: a zoff without its source tree found no tables).
printf 'Hello world, hello zoff.\n' > "$P/text.txt"
env -u ZOFF_DATA_DIR "$P/usr/bin/zoff" tokenize --quiet --val-fraction 0 --output-prefix "$P/tok" "$P/text.txt" 2>"$P/tok.err"
check "the installed zoff tokenizes with GPT-2 BPE" "[ \$? -eq 0 ] && [ -s '$P/tok_train.bin' ]"
echo '[' > "$P/usr/share/zoff/gpt2/encoder.json" # a broken installed table: the one the installed zoff must read
env -u ZOFF_DATA_DIR "$P/usr/bin/zoff" tokenize --quiet --val-fraction 0 --output-prefix "$P/tok2" "$P/text.txt" 2>"$P/tok2.err"
check "it reads the tables under its own prefix: a broken $P/usr/share/zoff/gpt2/encoder.json is refused by name" \
  "[ \$? -ne 0 ] && grep -q '$P/usr/share/zoff/gpt2/encoder.json' '$P/tok2.err' && [ ! -e '$P/tok2_train.bin' ]"

cat > "$P/consumer.c" <<'C'
#include <stdio.h>
#include <zoff/device.h>
int main(void) {
    zoff_device *dev = NULL;
    zoff_device_options o = {.kind = ZOFF_BACKEND_CPU};
    if (zoff_device_create(&o, &dev) != ZOFF_OK) { fprintf(stderr, "%s\n", zoff_last_error()); return 1; }
    float *x = NULL;
    if (zoff_device_alloc(dev, 4 * sizeof(float), "x", (void **)&x) != ZOFF_OK) return 1;
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    printf("in use %zu\n", ms.device_in_use);
    zoff_device_free(dev, x);
    zoff_device_destroy(dev);
    return ms.device_in_use == 16 ? 0 : 1;
}
C
export PKG_CONFIG_PATH="$lib/pkgconfig"
cc "$P/consumer.c" -o "$P/consumer_shared" $(pkg-config --cflags --libs zoff) >"$P/cc1.log" 2>&1
check "a program builds against the shared library with pkg-config" "[ \$? -eq 0 ]"
check "and runs" "LD_LIBRARY_PATH='$lib' '$P/consumer_shared' >/dev/null"
# static: libzoff.a plus what `pkg-config --static` lists (shared system libraries stay shared)
cc "$P/consumer.c" -o "$P/consumer_static" $(pkg-config --cflags zoff) "$lib/libzoff.a" \
   $(pkg-config --libs --static zoff | sed 's/-lzoff//') >"$P/cc2.log" 2>&1 || cat "$P/cc2.log"
check "a program links the static library" "[ -x '$P/consumer_static' ] && '$P/consumer_static' >/dev/null"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
