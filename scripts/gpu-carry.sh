#!/usr/bin/env bash
# Prepare what a GPU machine without network access needs to run scripts/gpu-rows.sh (#28's GPU rows):
#   .whl/      the service's packages that the GPU image lacks, as cp312 manylinux wheels, at the
#              versions this checkout's .venv runs (lingua is left out: 170 MB, over the 64 MiB a call
#              may carry; gpu-rows.sh serves with --language-detection false, which needs none of it)
#   .gpudata/  Multi30k's test sets that the benchmarks read (NMT_DATA)
# Both are git-ignored. Run here, with network access to PyPI, from the repository's root:
#   scripts/gpu-carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${NMT_DATA:-../shared/data/multi30k}
PACKAGES="fastapi fastapi-offline starlette uvicorn httptools pydantic pydantic-core pydantic-settings python-multipart
annotated-types typing-inspection python-dotenv pyzmq sentencex polib python-docx python-pptx"

rm -rf .whl && mkdir -p .whl .gpudata
pins=()
for name in $PACKAGES; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
    [ -n "$version" ] || { echo "gpu-carry: $name is not installed in $PY's environment" >&2; exit 1; }
    pins+=("$name==$version")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${pins[@]}"
cp "$DATA"/test_2016_flickr.* "$DATA"/test_2017_flickr.* .gpudata/ 2>/dev/null || cp "$DATA"/test_2016_flickr.* .gpudata/
du -sh .whl .gpudata
echo "carry: .whl .gpudata (with checkpoints/ and the code, under the 64 MiB a call takes)"
