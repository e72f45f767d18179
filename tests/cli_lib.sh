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
