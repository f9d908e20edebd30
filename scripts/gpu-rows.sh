#!/usr/bin/env bash
# #28's GPU rows on a lent GPU machine (the device tool's `run`), one stage per call, each well inside a
# call's 10 minutes; what a stage prints also lands in $OUT, which comes back. Prepare here first with
# scripts/gpu-carry.sh, then call, for example:
#   run(command="bash scripts/gpu-rows.sh tests", carry=[".whl", ".gpudata"])
#   run(command="bash scripts/gpu-rows.sh all", carry=[".whl", ".gpudata"], timeout_s=600)
# runs tests, joins, kernels, gpu and server in one call (about 5 minutes on an H200); a list picks others,
# within the call's 600 s: run(command="bash scripts/gpu-rows.sh all 'tests ab kernels gpu'", carry=[..., ".gpubase"])
# Stages, in the order to spend a lease on them:
#   tests    the CUDA tests: captured steps, joins and constraints against the eager programs (~2 min)
#   joins    bench.gpu: a join's host and GPU time against a replayed step's; latency; busy share
#   server   bench.server_load on the GPU: the engine alone, server vs offline at concurrency 256 (4 and 8 API
#            workers, 4 load generators, 4,096 requests), one request at a time, mixed traffic (4 API workers);
#            greedy with 4 workers left the engine idle half of each step (the API processes' CPU set the pace)
#   gpu      bench.gpu: throughput (batch 1-2048), ours vs transformers' generate, static vs eager parity
#   kernels  bench.gpu: a static search's GPU time by kernel (greedy 2048 and 256, beam 4 256), busy share
#   engine-profile  py-spy on the engine process through bench.server_load's throughput section (4 API
#            workers, 8,192 requests, greedy then beam 4): where the engine loop's host time goes
#   switch   bench.server_load's throughput section (greedy and beam 4, 4 API workers) with the engine process's
#            GIL switch interval at Python's 5 ms and at 0.5 ms, alternating, one run each: the engine's I/O
#            thread screens thousands of calls a second beside the main loop (on 2 CPU cores: +8% with one
#            lane of two threads, nothing with the default lanes; not adopted on that evidence)
#   check    bench.server_load's throughput section (greedy and beam 4, 4 API workers) with the `detached` check
#            as shipped (attention_check=borderline: every /v1/translate sentence's search keeps its attention,
#            steps 1.5-1.7x a plain step's GPU time in bench.gpu's joins section) and off, one run each: how much
#            of the server's gap to the offline engine (which keeps none) the quality check is
#   engine-host  bench.engine_host --process --device cuda: the engine process with stand-in programs (captured and
#            replayed on the GPU, a few kernels each) called by the API's client at concurrency 256: the sentences/s its
#            host work alone allows (the greedy server needs 0.6 of the offline engine's ~10,500), this tree and, with a
#            .gpubase of b802041 or later, the base alternating (on the 2-core VM: 0.77 of the CPU per sentence there)
#   join-any-step  bench.server_load's throughput and mixed sections (4 API workers) with the device search joining
#            waiting sentences only at its checks (as shipped: every 4 steps) and at any step where it has room (patched
#            in the engine process only), one run each: the greedy server ran 70 rows a step at concurrency 256, the
#            rest of its calls waiting for a check among other places; a join costs 0.13-1.04 of a step's GPU time
#   lookahead  bench.server_load's throughput and mixed sections (4 API workers) with the device search taking a
#            check's reads in once the next step is queued (as shipped on CUDA) and at once (patched in the engine
#            process only), one run each: whether the GPU computing a step while the engine loop waits for a read,
#            replies and joins closes part of the gap (the H200's greedy server: 1.39 ms a step, 0.36 of GPU)
#   offline-profile  bench.gpu's offline section (greedy batch 2,048, then beam 4 batch 256, natural order, as the
#            throughput rows) under py-spy, idle samples kept: where a batch's wall time goes on the host (the
#            reads waited for, the checks, collecting hypotheses, padding, the encoder's launches) against its
#            kernels' time; greedy 2,048 ran 24,900-36,200 sentences/s (goal 40,000), 24-28% busy under the profiler
#   shapes   bench.real_shapes on the GPU (#27's rows): a random OPUS-MT (Marian, 74M) and a random NLLB-200 600M in
#            float16, ours against transformers' generate at batch 1, 32 and 256, greedy and beam 4, a 32-token cap
#            (goals: OPUS-MT beam 4 batch 32 >= 9x generate; NLLB-600M one sentence greedy p50 <= 25 ms); building the
#            random 600M model is a minute or two of the host's CPU
#   shapes-serve  NLLB-600M serving 256 rows of 256 positions (goal: within 8 GB) and the service on it at concurrency
#            256 (goal: >= 1,000 requests/s); reuses the model `shapes` built where the machine still has it
#   train    configs/debian-gpu.json: a 24M-parameter model (6+3 layers, d_model 384, a 16,000-piece tokenizer
#            of captions and debian-v3) trained from scratch on Multi30k and debian-v3 for max_minutes (7), its
#            best checkpoints averaged and exported in float16 as it stops (export_at_stop); the weights come
#            back in 15 MiB parts (a file may be 16 MiB), with config.json, spm.model and the run's log. Alone in
#            a call (timeout_s 600), carry .gpucorpus (scripts/gpu-carry.sh train); here
#            scripts/gpu-carry.sh model FILES_AT puts the checkpoint together
#   replicas bench.server_load's throughput section (4 API workers each, concurrency 256 in all, 4 load generators)
#            with one server and with two side by side on the GPU, the load split between them, alternating: whether a
#            second engine loop serves more where one engine's host work leaves the GPU idle (the H200's greedy server:
#            4,205-4,625 requests/s, the engine loop 0.92 busy, 111 rows a step of 256, the GPU ~0.4 busy); if it does,
#            engine processes per GPU are worth building (#28: "the number of engine workers per node")
#   engines  bench.server_load's throughput and mixed sections with the server's engine processes at 1 and 2 (--engines;
#            8 API workers each, concurrency 256, 4 load generators), alternating: what a second engine loop on the GPU
#            gives the greedy server (goal >= 0.6 of the offline engine) and the mixed traffic's short requests (goal
#            <= 2x alone), where one engine's loop is the limit (0.92 busy, the GPU ~0.4 busy)
#   check-every  bench.server_load's throughput and mixed sections (4 API workers) with the device search reading which
#            sentences finished every 4 steps (as shipped) and every 2 (patched in the engine process only), one run each:
#            a short request waits for a check to join and another to leave (the H200's mixed traffic: short requests'
#            p50 20-21 ms at concurrency 32 against 9 alone, 2.30-2.32; the long ones add only 1.04-1.07 of it)
#   shape-kernels  bench.gpu's kernels section on a random OPUS-MT (74M, 58,101 vocabulary rows, built by bench.real_shapes
#            --engines ''), outputs capped at 32 tokens: where its beam 4 batch 256 goes (1,539 sentences/s, 1.62x
#            generate, against 4,541 and 5.1x for the shipped model's twin)
#   step-attention  bench.gpu's attention section (each backend per call, and the static decoder's matmul variant, at the
#            step's shapes: 1,024 rows x 64 positions, 2,048 x 48), then its static float16 throughput with the step's
#            attention as shipped (sdpa: the memory-efficient kernel, 52% of greedy 2,048's kernel time on the H200, 65 us
#            a call) and as two products around a softmax (static_decoder.STEP_ATTENTION "matmul", patched in), two rounds
#   grouped  bench.server_load's engine section (the continuous device search alone, 256 in flight, greedy and beam 4) with
#            the engine's decoders as shipped (a sentence's beams share its source's keys and values) and ungrouped (a copy
#            per row, as before), alternating, two rounds: what sharing them gives beam 4's steps (the H200's engine section
#            ran beam 4 at 10,064 sentences/s ungrouped)
#   ab       bench.gpu's static float16 throughput, the package in .gpubase (gpu-carry.sh base REV) and this
#            tree alternating, two rounds each: a change measured on one machine
#   lone-search  the CPU only, on the GPU machine's host: bench.lone_search (one request at a time through the CPU engine,
#            a lone search on one thread against on the cores the room leaves) on all its cores, then on 4 and on 2
#            (taskset): whether the room's widest team still pays past the 2 cores it was measured on (1.16x there)
# The service runs with language detection off (NMT_LANGUAGE_DETECTION=false): the GPU image lacks
# lingua, whose wheel is too large to carry, and the benchmarks name their source language.
set -uo pipefail
stage=${1:?"stage: tests | joins | server | gpu | kernels | offline-profile | shapes | shapes-serve | engine-profile | switch | check | engine-host | replicas | engines | check-every | shape-kernels | step-attention | grouped | join-any-step | lookahead | ab | lone-search | train | all"}
out=${OUT:-/tmp/gpu-rows}
mkdir -p "$out"
if [ "$stage" = all ]; then
    # every stage in one call (a lease is 15 minutes, each start costs one): each under its own time limit,
    # their files packed into $OUT/rows.tgz after each (a call brings back at most 8 files), a summary printed
    # (the default list's limits add up to 690 s, past a call's 600: name fewer; most stages took half their limit on an H200,
    # gpu ran past its earlier 150 s before its hf and parity sections)
    work=/tmp/gpu-rows-all && mkdir -p "$work"
    declare -A limit=([tests]=90 [ab]=120 [joins]=90 [kernels]=90 [gpu]=240 [server]=180 [engine-profile]=150 [switch]=240 [check]=240
                      [engine-host]=150 [replicas]=300 [engines]=420 [check-every]=300 [shape-kernels]=200 [step-attention]=300 [grouped]=240 [join-any-step]=300 [lookahead]=300 [offline-profile]=150 [shapes]=420 [shapes-serve]=420 [lone-search]=240)
    for name in ${2:-tests joins kernels gpu server}; do
        OUT=$work timeout -k 5 "${limit[$name]:-120}" bash "$0" "$name" > "$work/$name.out" 2>&1
        echo "== $name rc=$?"
        tail -n 25 "$work/$name.out"
        tar czf "$out/rows.tgz" -C "$work" .
    done
    exit 0
fi
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD NMT_DATA=$PWD/.gpudata NMT_LANGUAGE_DETECTION=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
case $stage in
    train)
        [ -f .gpucorpus/tokenizer/spm.model ] || { echo "train: carry .gpucorpus (scripts/gpu-carry.sh train)" >&2; exit 1; }
        run=${TRAIN_RUN:-/tmp/debian-gpu}
        args=(--config configs/debian-gpu.json --run-dir "$run" --output "$run/final"
              --train-data '.gpucorpus/train.{lang}.gz' --valid-data '.gpucorpus/val.{lang}.gz'
              --pair-data '.gpucorpus/debian-v3/train.{pair}.{lang}.gz' --spm-model .gpucorpus/tokenizer/spm.model)
        # TRAIN_FLAGS: overrides for a dry run elsewhere (--device cpu --max-minutes 0.2 ...)
        # shellcheck disable=SC2086
        python3 -m nmt_serve.training.train "${args[@]}" ${TRAIN_FLAGS:-} > "$out/train.out" 2>&1
        rc=$?; echo "training and export rc=$rc"; [ $rc = 0 ] || tail -n 40 "$out/train.out"
        rm -f "$out/train.out"  # a call brings back 8 files: 4 parts, config, tokenizer, log, gpu.txt
        cp "$run/train.log" "$out/train.log" && tail -n 30 "$out/train.log"
        split -b 15M -d "$run/final/model.safetensors" "$out/model.safetensors.part-"
        cp "$run/final/config.json" "$run/final/spm.model" "$out/"
        ls -la "$out" ;;
    tests)
        python3 -m pytest -q -m cuda -p no:cacheprovider tests/unit/test_device_search.py tests/unit/test_continuous.py \
            tests/unit/test_device_constraints.py tests/unit/test_translator.py tests/unit/test_memory_plan.py tests/unit/test_host_copy.py 2>&1 | tee "$out/tests.log" ;;
    joins)
        python3 -m bench.gpu --quick --sections joins,latency,busy --output "$out/joins.md" --json "$out/joins.json" 2>&1 | tee "$out/joins.log" ;;
    server)
        python3 -m bench.server_load --device cuda --sections engine,throughput,single,mixed --concurrency 256 --batch 256 \
            --requests 4096 --workers 4,8 --mixed-workers 4 --clients 4 --output "$out/server.md" 2>&1 | tee "$out/server.log" ;;
    gpu)
        python3 -m bench.gpu --quick --sections throughput,hf,parity --output "$out/gpu.md" --json "$out/gpu.json" 2>&1 | tee "$out/gpu.log" ;;
    kernels)
        python3 -m bench.gpu --quick --sections kernels,busy --output "$out/kernels.md" --json "$out/kernels.json" 2>&1 | tee "$out/kernels.log" ;;
    offline-profile)
        for run in 1:2048 4:256; do
            name=offline-${run/:/-}
            /tmp/site/bin/py-spy record --idle -r 500 -f raw -o "$out/$name.raw" -- python3 -m bench.gpu --sections offline \
                --offline-runs "$run" --output "$out/$name.md" > "$out/$name.log" 2>&1
            if [ ! -s "$out/$name.raw" ]; then  # py-spy could not run the command: the figures without the profile
                tail -n 3 "$out/$name.log"
                python3 -m bench.gpu --sections offline --offline-runs "$run" --output "$out/$name.md" >> "$out/$name.log" 2>&1
            fi
            grep -A3 "^| search" "$out/$name.md"
            python3 -m bench.folded "$out/$name.raw" --top 50 --within "offline_section.<locals>.measured gpu.py" | tee "$out/$name.txt"
        done ;;
    shapes)
        python3 -m bench.real_shapes --device cuda --shape opus-mt --batch 32,256 --sentences-b1 50 --max-new-tokens 32 \
            --work /tmp/shape-opus-mt --output "$out/shapes-opus-mt.md" 2>&1 | tee "$out/shapes-opus-mt.log"
        python3 -m bench.real_shapes --device cuda --shape nllb-600m --batch 32,256 --sentences-b1 50 --max-new-tokens 32 \
            --work /tmp/shape-nllb --output "$out/shapes-nllb.md" 2>&1 | tee "$out/shapes-nllb.log" ;;
    shapes-serve)
        python3 -m bench.real_shapes --device cuda --shape nllb-600m --engines '' --max-new-tokens 32 --memory --server 4096 \
            --work /tmp/shape-nllb --output "$out/shapes-nllb-serve.md" 2>&1 | tee "$out/shapes-nllb-serve.log" ;;
    engine-profile)
        python3 -m bench.server_load --device cuda --sections throughput --workers 4 --clients 4 --concurrency 256 \
            --batch 256 --requests 8192 --output "$out/engine-profile-load.md" > "$out/engine-profile-load.log" 2>&1 &
        load=$!
        pid=
        for _ in $(seq 1 1200); do
            pid=$(pgrep -f nmt_serve.engine.process | head -1)
            [ -n "$pid" ] && break
            sleep 0.1
        done
        [ -n "$pid" ] || { echo "no engine process appeared" >&2; wait $load; exit 1; }
        # until the engine exits (the section stops the server): its start, warm-up and both loads
        /tmp/site/bin/py-spy record -p "$pid" -r 250 -f raw -o "$out/engine.raw" --nonblocking > "$out/py-spy.log" 2>&1 &
        spy=$!
        wait $load
        wait $spy
        tail -n 3 "$out/py-spy.log"
        grep -A4 "^| API workers" "$out/engine-profile-load.md"
        python3 -m bench.folded "$out/engine.raw" --top 60 | tee "$out/engine-profile.txt" ;;
    switch)
        # a sitecustomize that sets the interval in the engine process only (its command line names it)
        mkdir -p /tmp/switch-site
        printf '%s\n' 'import os, sys' \
            'if os.environ.get("NMT_ENGINE_SWITCH_S") and b"nmt_serve.engine.process" in open("/proc/self/cmdline", "rb").read():' \
            '    sys.setswitchinterval(float(os.environ["NMT_ENGINE_SWITCH_S"]))' > /tmp/switch-site/sitecustomize.py
        for interval in default 0.0005; do
            if [ $interval = default ]; then unset NMT_ENGINE_SWITCH_S; else export NMT_ENGINE_SWITCH_S=$interval; fi
            PYTHONPATH=/tmp/switch-site:$PYTHONPATH python3 -m bench.server_load --device cuda --sections throughput --workers 4 \
                --clients 4 --concurrency 256 --batch 256 --requests 4096 --output "$out/switch-$interval.md" > "$out/switch-$interval.log" 2>&1
            grep -A4 "^| API workers" "$out/switch-$interval.md" | sed "s/^/$interval /"
        done 2>&1 | tee "$out/switch.txt" ;;
    check)
        for check in borderline off; do
            NMT_ATTENTION_CHECK=$check python3 -m bench.server_load --device cuda --sections throughput --workers 4 \
                --clients 4 --concurrency 256 --batch 256 --requests 4096 --output "$out/check-$check.md" > "$out/check-$check.log" 2>&1
            grep -A4 "^| API workers" "$out/check-$check.md" | sed "s/^/$check /"
        done 2>&1 | tee "$out/check.txt" ;;
    replicas)
        for n in 1 2; do
            python3 -m bench.server_load --device cuda --sections throughput --workers 4 --replicas $n --clients 4 \
                --concurrency 256 --batch 256 --requests 4096 --output "$out/replicas-$n.md" > "$out/replicas-$n.log" 2>&1
            grep -A4 "^| API workers" "$out/replicas-$n.md"
        done 2>&1 | tee "$out/replicas.txt" ;;
    engines)
        for n in 1 2; do
            python3 -m bench.server_load --device cuda --sections throughput,mixed --workers 8 --mixed-workers 8 --engines $n \
                --clients 4 --concurrency 256 --batch 256 --requests 4096 --output "$out/engines-$n.md" > "$out/engines-$n.log" 2>&1
            grep -A4 "^| API workers\|^| short alone" "$out/engines-$n.md" | sed "s/^/engines $n /"
        done 2>&1 | tee "$out/engines.txt" ;;
    grouped)
        for round in 1 2; do
            for kind in grouped ungrouped; do
                python3 -m bench.server_load --device cuda --sections engine --concurrency 256 --batch 256 --requests 4096 \
                    $([ $kind = ungrouped ] && echo --ungrouped) --output "$out/grouped-$kind-$round.md" > "$out/grouped-$kind-$round.log" 2>&1
                grep "| device |" "$out/grouped-$kind-$round.md" | sed "s/^/$kind $round /"
            done
        done 2>&1 | tee "$out/grouped.txt" ;;
    step-attention)
        mkdir -p /tmp/attention-site
        printf '%s\n' 'import os' 'if os.environ.get("NMT_STEP_ATTENTION"):' '    from nmt_serve.inference import static_decoder' \
            '    static_decoder.STEP_ATTENTION = os.environ["NMT_STEP_ATTENTION"]' > /tmp/attention-site/sitecustomize.py
        python3 -m bench.gpu --sections attention --output "$out/attention.md" > "$out/attention.log" 2>&1
        grep "decoder step" "$out/attention.md"
        for round in 1 2; do
            for impl in sdpa matmul; do
                NMT_STEP_ATTENTION=$impl PYTHONPATH=/tmp/attention-site:$PYTHONPATH python3 -m bench.gpu --quick --sections throughput \
                    --plans float16:auto --output "$out/step-attention-$impl-$round.md" > "$out/step-attention-$impl-$round.log" 2>&1
                grep "static (CUDA graphs)" "$out/step-attention-$impl-$round.md" | cut -d'|' -f4-6 | tr -d ' ' | sed "s/^/$impl $round /"
            done
        done 2>&1 | tee "$out/step-attention.txt" ;;
    shape-kernels)
        python3 -m bench.real_shapes --device cuda --shape opus-mt --engines '' --work /tmp/shape-opus-mt > "$out/shape-kernels.log" 2>&1
        python3 -m bench.gpu --sections kernels --checkpoint /tmp/shape-opus-mt/ours --max-length 32 --output "$out/shape-kernels.md" \
            >> "$out/shape-kernels.log" 2>&1
        grep -B1 -A8 "^#### " "$out/shape-kernels.md" | head -n 60 ;;
    check-every)
        mkdir -p /tmp/check-site
        printf '%s\n' 'import os' \
            'if os.environ.get("NMT_CHECK_EVERY") and b"nmt_serve.engine.process" in open("/proc/self/cmdline", "rb").read():' \
            '    from nmt_serve.inference import continuous_device' \
            '    init = continuous_device.ContinuousDeviceSearch.__init__' \
            '    continuous_device.ContinuousDeviceSearch.__init__ = lambda self, *a, **k: init(self, *a, **{**k, "check_every": int(os.environ["NMT_CHECK_EVERY"])})' \
            > /tmp/check-site/sitecustomize.py
        for every in 4 2; do
            if [ $every = 4 ]; then unset NMT_CHECK_EVERY; else export NMT_CHECK_EVERY=$every; fi
            PYTHONPATH=/tmp/check-site:$PYTHONPATH python3 -m bench.server_load --device cuda --sections throughput,mixed \
                --workers 4 --mixed-workers 4 --clients 4 --concurrency 256 --batch 256 --requests 4096 \
                --output "$out/check-every-$every.md" > "$out/check-every-$every.log" 2>&1
            grep -A4 -E "^\| (API workers|short alone)" "$out/check-every-$every.md" | sed "s/^/every $every /"
        done 2>&1 | tee "$out/check-every.txt" ;;
    join-any-step)
        mkdir -p /tmp/joins-site
        printf '%s\n' 'import os' \
            'if os.environ.get("NMT_JOIN_ANY_STEP") and b"nmt_serve.engine.process" in open("/proc/self/cmdline", "rb").read():' \
            '    from nmt_serve.inference.continuous_device import ContinuousDeviceSearch' \
            '    ContinuousDeviceSearch.joinable = lambda self: True' > /tmp/joins-site/sitecustomize.py
        for policy in checks any-step; do
            if [ $policy = checks ]; then unset NMT_JOIN_ANY_STEP; else export NMT_JOIN_ANY_STEP=1; fi
            PYTHONPATH=/tmp/joins-site:$PYTHONPATH python3 -m bench.server_load --device cuda --sections throughput,mixed --workers 4 \
                --mixed-workers 4 --clients 4 --concurrency 256 --batch 256 --requests 4096 --output "$out/joins-$policy.md" \
                > "$out/joins-$policy.log" 2>&1
            grep -A4 -E "^\| (API workers|short alone)" "$out/joins-$policy.md" | sed "s/^/$policy /"
        done 2>&1 | tee "$out/join-any-step.txt" ;;
    lookahead)
        mkdir -p /tmp/lookahead-site
        printf '%s\n' 'import os' \
            'if os.environ.get("NMT_NO_LOOKAHEAD") and b"nmt_serve.engine.process" in open("/proc/self/cmdline", "rb").read():' \
            '    from nmt_serve.inference import device_search' \
            '    init = device_search.DeviceSearch.__init__' \
            '    device_search.DeviceSearch.__init__ = lambda self, *a, **k: init(self, *a, **{**k, "lookahead": False})' \
            > /tmp/lookahead-site/sitecustomize.py
        for reads in lookahead at-once; do
            if [ $reads = lookahead ]; then unset NMT_NO_LOOKAHEAD; else export NMT_NO_LOOKAHEAD=1; fi
            PYTHONPATH=/tmp/lookahead-site:$PYTHONPATH python3 -m bench.server_load --device cuda --sections throughput,mixed \
                --workers 4 --mixed-workers 4 --clients 4 --concurrency 256 --batch 256 --requests 4096 \
                --output "$out/lookahead-$reads.md" > "$out/lookahead-$reads.log" 2>&1
            grep -A4 -E "^\| (API workers|short alone)" "$out/lookahead-$reads.md" | sed "s/^/$reads /"
        done 2>&1 | tee "$out/lookahead.txt" ;;
    engine-host)
        python3 -m bench.engine_host --process --device cuda --concurrency 256 --requests 20000 --rounds 2 \
            $([ -d .gpubase/nmt_serve ] && echo --compare .gpubase) --output "$out/engine-host.md" 2>&1 | tee "$out/engine-host.log" ;;
    ab)
        [ -d .gpubase/nmt_serve ] || { echo "no .gpubase: run scripts/gpu-carry.sh base REV here first" >&2; exit 2; }
        here=$PWD
        for round in 1 2; do
            for tree in base new; do
                # python -m puts the working directory first on sys.path: the base runs from inside .gpubase
                # so that its nmt_serve, not this tree's, is the one imported (bench/ comes from this tree)
                if [ $tree = base ]; then dir=$here/.gpubase; else dir=$here; fi
                (cd "$dir" && PYTHONPATH=$dir:$PYTHONPATH python3 -c "import nmt_serve; print('$tree:', nmt_serve.__file__)" &&
                 PYTHONPATH=$dir:$PYTHONPATH python3 -m bench.gpu --quick --sections throughput --plans float16:auto \
                     --output "$out/ab-$tree-$round.md" > "$out/ab-$tree-$round.log" 2>&1)
                grep "static (CUDA graphs)" "$out/ab-$tree-$round.md" | cut -d'|' -f4-6 | tr -d ' ' | sed "s/^/$tree $round /"
            done
        done 2>&1 | tee "$out/ab.txt" ;;
    lone-search)
        for cpus in all 0-3 0-1; do
            pin=(); [ $cpus = all ] || pin=(taskset -c "$cpus")
            echo "== cpus $cpus"
            GOMP_SPINCOUNT=10000 "${pin[@]}" python3 -m bench.lone_search --sentences 32 --rounds 2 \
                --output "$out/lone-search-$cpus.md" > "$out/lone-search-$cpus.log" 2>&1
            grep -E "^\| (greedy|beam)" "$out/lone-search-$cpus.md"
        done 2>&1 | tee "$out/lone-search.txt" ;;
    *)
        echo "unknown stage: $stage" >&2; exit 2 ;;
esac
