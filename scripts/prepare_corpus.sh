#!/usr/bin/env bash
# Build zoff's default training corpus from Debian's `fortunes` package.
#
#   scripts/prepare_corpus.sh OUTDIR        -> OUTDIR/corpus.txt
#
# Source: the plain-text fortune files in /usr/share/games/fortunes (override with
# ZOFF_FORTUNES_DIR). Taken: every regular file directly in that folder, in byte
# order of their names. Skipped: the binary index files (*.dat), the *.u8 symlinks
# (they point at the same files) and any subdirectory (the "off"ensive set, when
# installed, lives in off/).
#
# Format of corpus.txt (UTF-8 plain text): each fortune entry, with its lines as in
# the package, followed by one empty line. The '%' separator lines are removed (an
# empty line stands in for them). In every line, terminal overstriking is resolved
# as a terminal shows it (a backspace erases the character before it:
# "____\b\b\b\bBODY" -> "BODY", "X\bX" -> "X"), other control characters (bell, ...)
# are removed (tabs are kept), then trailing spaces and tabs are cut. Empty lines at
# the start and end of an entry are dropped. The output is deterministic for a given
# package version: 2,560,755 bytes, 15,217 entries from fortunes 1:1.99.1-7.3.
#
# The file is written to a temporary name and renamed, so an interrupted run
# leaves no partial corpus.txt. zoff_corpus_build_fortunes() in src/data/corpus.c
# implements the same rules in C (for `zoff train`'s default job); tests/test_data.c
# checks that both produce the same bytes. Then, for training:
#   zoff tokenize --tokenizer gpt2 --output-prefix OUTDIR/corpus OUTDIR/corpus.txt
set -euo pipefail

usage() { echo "usage: $0 OUTDIR   (writes OUTDIR/corpus.txt from Debian's fortunes package)" >&2; }

if [[ $# -ne 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  usage
  [[ $# -eq 1 ]] && exit 0 || exit 2
fi
out_dir=$1
src=${ZOFF_FORTUNES_DIR:-/usr/share/games/fortunes}

files=()
if [[ -d "$src" ]]; then
  while IFS= read -r -d '' f; do
    case "$f" in *.dat|*.u8) continue ;; esac
    files+=("$f")
  done < <(find "$src" -mindepth 1 -maxdepth 1 -type f -print0 | LC_ALL=C sort -z)
fi
if [[ ${#files[@]} -eq 0 ]]; then
  echo "prepare_corpus.sh: no fortune files in $src; install the corpus with: apt-get install fortunes" >&2
  exit 1
fi
command -v perl >/dev/null || { echo "prepare_corpus.sh: perl is required (apt-get install perl-base)" >&2; exit 1; }

mkdir -p "$out_dir"
tmp=$(mktemp "$out_dir/.corpus.txt.XXXXXX")
trap 'rm -f "$tmp" "$tmp.log"' EXIT

perl -CSD -e '
  use strict; use warnings;
  my ($entries, @lines) = (0);
  sub flush {
    shift @lines while @lines && $lines[0] eq "";
    pop @lines while @lines && $lines[-1] eq "";
    if (@lines) { print join("\n", @lines), "\n\n"; $entries++; }
    @lines = ();
  }
  for my $file (@ARGV) {
    open(my $fh, "<:encoding(UTF-8)", $file) or die "cannot read $file: $!\n";
    while (my $l = <$fh>) {
      $l =~ s/\r?\n\z//;
      if ($l eq "%") { flush(); next; }
      1 while $l =~ s/[^\x08]\x08//;          # backspace erases the character before it
      $l =~ s/[\x00-\x08\x0b-\x1f\x7f]//g;     # other control characters (tab is \x09)
      $l =~ s/[ \t]+\z//;                   # trailing blanks
      push @lines, $l;
    }
    flush();
    close($fh);
  }
  print STDERR "entries: $entries\n";
' "${files[@]}" > "$tmp" 2> "$tmp.log" || { cat "$tmp.log" >&2; rm -f "$tmp.log"; exit 1; }
entries=$(sed -n 's/^entries: //p' "$tmp.log")
rm -f "$tmp.log"
chmod 644 "$tmp"
mv -f "$tmp" "$out_dir/corpus.txt"
trap - EXIT
bytes=$(wc -c < "$out_dir/corpus.txt")
echo "wrote $out_dir/corpus.txt: $bytes bytes, $entries entries from ${#files[@]} files in $src"
