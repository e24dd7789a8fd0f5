#!/usr/bin/env bash
# expect.sh RC REGEX CMD...: runs CMD, prints its output, and passes only if its exit status is RC
# ("nonzero": any failure) AND its output matches the extended regex REGEX. (ctest's
# PASS_REGULAR_EXPRESSION would ignore the exit status.)
want=$1 re=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$want" = nonzero ]; then
  [ "$rc" -ne 0 ] || { echo "expect.sh: exit status 0, wanted a failure"; exit 1; }
elif [ "$rc" -ne "$want" ]; then
  echo "expect.sh: exit status $rc, wanted $want"
  exit 1
fi
grep -Eq -- "$re" <<<"$out" || { echo "expect.sh: the output does not match: $re"; exit 1; }
