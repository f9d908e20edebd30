#!/usr/bin/env bash
# Prepare what a GPU machine without network access needs to run scripts/gpu-rows.sh (#28's GPU rows):
#   .whl/      the service's packages that the GPU image lacks (and py-spy), as cp312 manylinux wheels, at the
#              versions this checkout's .venv runs (lingua is left out: 170 MB, over the 64 MiB a call
#              may carry; gpu-rows.sh serves with --language-detection false, which needs none of it)
#   .gpudata/  Multi30k's test sets that the benchmarks read (NMT_DATA)
# Both are git-ignored. Run here, with network access to PyPI, from the repository's root:
#   scripts/gpu-carry.sh
#
# A call takes the tracked files too, 64 MiB in all, and checkpoints/ alone is about 62 MB: the tests,
# `joins` and `gpu` stages fit with .gpudata, the `server` stage's wheels (7 MB) do not. For that one call:
#   scripts/gpu-carry.sh slim      untrack (git rm --cached, files kept) the checkpoints no GPU row reads
#   ... run(command="bash scripts/gpu-rows.sh server", carry=[".whl", ".gpudata"]) ...
#   scripts/gpu-carry.sh restore   track them again (nothing is committed in between)
# The tracked files are now 18 MB without those checkpoints, so `slim` before every call leaves room.
#
# Training the next shipped model on the GPU (configs/debian-gpu.json, ~7 minutes of training in one call):
#   scripts/gpu-carry.sh slim && scripts/gpu-carry.sh train      .gpucorpus: the data and the run's tokenizer
#   ... run(command="bash scripts/gpu-rows.sh train", carry=[".gpucorpus"], timeout_s=600) ...
#   scripts/gpu-carry.sh model FILES_AT [runs/debian-gpu/final]   the checkpoint from the files that came back
#   scripts/gpu-carry.sh restore
#
# A change measured before/after on one machine (the host's pace moves 30% between machines and runs):
#   scripts/gpu-carry.sh base REV  .gpubase/nmt_serve: the package as it was at REV (git-ignored)
#   ... run(command="bash scripts/gpu-rows.sh ab", carry=[".whl", ".gpudata", ".gpubase"]) ...
set -euo pipefail
cd "$(dirname "$0")/.."
UNREAD="checkpoints/en-de checkpoints/multi30k checkpoints/debian-multi30k"  # the GPU rows read de-en
EXCLUDE=$(git rev-parse --git-path info/exclude)
case ${1:-} in
    slim)
        mkdir -p "$(dirname "$EXCLUDE")"
        for c in $UNREAD; do echo "/$c/" >> "$EXCLUDE"; done  # git reads no comment after a pattern
        git rm -r -q --cached $UNREAD
        echo "untracked for one call: $UNREAD (restore: scripts/gpu-carry.sh restore)"
        exit 0 ;;
    base)
        rev=${2:?"base REV: the revision to measure against"}
        rm -rf .gpubase && mkdir -p .gpubase
        git archive "$rev" nmt_serve | tar -x -C .gpubase
        echo "$(git rev-parse --short "$rev")" > .gpubase/REVISION
        echo ".gpubase: nmt_serve at $(cat .gpubase/REVISION) (carry it with the ab stage)"
        exit 0 ;;
    train)
        # what `gpu-rows.sh train` reads (configs/debian-gpu.json on the GPU): debian-v3's English pairs and
        # Multi30k's train and val gzipped, and the run's tokenizer made here (sentencepiece over the whole
        # training text: minutes of the lease's CPU otherwise). Carry .gpucorpus (about 21 MB), after `slim`.
        [ -f corpora/debian-v3/manifest.json ] || { echo "gpu-carry train: build the corpus first (nmt-corpus)" >&2; exit 1; }
        rm -rf .gpucorpus && mkdir -p .gpucorpus/debian-v3
        for f in corpora/debian-v3/train.en-*; do gzip -9nc "$f" > ".gpucorpus/debian-v3/$(basename "$f").gz"; done
        cp corpora/debian-v3/manifest.json .gpucorpus/debian-v3/
        cp "${NMT_DATA:-../shared/data/multi30k}"/{train,val}.*.gz .gpucorpus/
        "${PY:-.venv/bin/python}" -m nmt_serve.training.train --config configs/debian-gpu.json --tokenizer-only 1 \
            --run-dir .gpucorpus/tokenizer --device cpu --threads 2
        rm -f .gpucorpus/tokenizer/train.log .gpucorpus/tokenizer/spm.vocab
        du -sh .gpucorpus
        exit 0 ;;
    model)
        # the train stage's files (they came back to DIR) as a checkpoint directory (default runs/debian-gpu/final)
        src=${2:?"model DIR: where the train stage's files came back"}
        dst=${3:-runs/debian-gpu/final}
        mkdir -p "$dst"
        cat "$src"/model.safetensors.part-* > "$dst/model.safetensors"
        cp "$src/config.json" "$src/spm.model" "$dst/"
        [ ! -f "$src/README.md" ] || cp "$src/README.md" "$dst/"
        echo "$dst: $(du -sh "$dst" | cut -f1)"
        exit 0 ;;
    restore)
        git reset -q -- $UNREAD
        for c in $UNREAD; do [ ! -f "$EXCLUDE" ] || sed -i "\\#^/$c/\$#d" "$EXCLUDE"; done
        git status --short -- checkpoints
        exit 0 ;;
esac
PY=${PY:-.venv/bin/python}
PY_SPY=0.4.3
DATA=${NMT_DATA:-../shared/data/multi30k}
PACKAGES="fastapi fastapi-offline starlette uvicorn httptools pydantic pydantic-core pydantic-settings python-multipart
annotated-types typing-inspection python-dotenv pyzmq sentencex polib python-docx python-pptx py3langid webvtt-py w3lib opentelemetry-api"
# published as source only: built into a wheel here (pure Python, so it runs there too)
SOURCE_ONLY="srt"

rm -rf .whl && mkdir -p .whl .gpudata
pin() {
    local version
    version=$("$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p')
    [ -n "$version" ] || { echo "gpu-carry: $1 is not installed in $PY's environment" >&2; exit 1; }
    echo "$1==$version"
}
pins=(); for name in $PACKAGES; do pins+=("$(pin "$name")"); done
sources=(); for name in $SOURCE_ONLY; do sources+=("$(pin "$name")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${pins[@]}"
"$PY" -m pip wheel -q --no-deps -w .whl "${sources[@]}"
# py-spy (a sampling profiler, a static binary in its wheel) for gpu-rows.sh's engine-profile stage
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl "py-spy==$PY_SPY"
cp "$DATA"/test_2016_flickr.* "$DATA"/test_2017_flickr.* .gpudata/ 2>/dev/null || cp "$DATA"/test_2016_flickr.* .gpudata/
du -sh .whl .gpudata
echo "carry: .whl .gpudata (with checkpoints/ and the code, under the 64 MiB a call takes)"
