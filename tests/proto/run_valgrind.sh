#!/bin/sh
# usage: run_valgrind.sh PROGRAM SUPPRESSIONS
# Runs PROGRAM under memcheck; fails on any error or definite/indirect leak.
# Exits 77 (meson's skip) where valgrind is not installed.
command -v valgrind >/dev/null 2>&1 || { echo "valgrind not installed: skipped"; exit 77; }
exec valgrind --quiet --error-exitcode=99 --leak-check=full \
  --errors-for-leak-kinds=definite,indirect,possible --show-leak-kinds=definite,indirect,possible \
  --suppressions="$2" --num-callers=30 "$1"
