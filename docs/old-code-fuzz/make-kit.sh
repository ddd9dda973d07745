#!/usr/bin/env bash
# Build the kit that runs the stream-ordering fuzzer on the allocator of commit 9059930 (the
# code issue 7 was filed against), on the CPU model of CUDA.  Usage, from the repository root:
#   bash docs/old-code-fuzz/make-kit.sh /tmp/oldfuzz
# Needs git, and a Python with the test extra installed (pip install -e '.[test]').
set -euo pipefail
kit=${1:?usage: make-kit.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$kit/tests" "$kit/logs"
git archive 9059930 numba_pool | tar -x -C "$kit"                      # the old allocator
git archive fdf6492 tests/cuda_model.py tests/test_fuzz.py tests/model_harness.py | tar -x -C "$kit"
(cd "$kit" && patch -s -p1 < "$here/harness.patch")                     # the changes marked OLDFUZZ
cp "$here/driver_shim.py" "$kit/numba_pool/driver.py"                   # the seam the old code lacks
cp "$here/conftest.py" "$here/test_fuzz_targeted.py" "$kit/tests/"
echo "kit in $kit: cd $kit && PYTHONPATH=$kit:$kit/tests python -m pytest -p no:cacheprovider -x -q tests/test_fuzz.py -k Fuzz1ThreadArena --hypothesis-seed=1"
