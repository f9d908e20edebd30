"""The models an engine serves: one Translator per language pair, found in the models directory."""
from __future__ import annotations

import logging
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nmt_serve.engine.memory_plan import GIB, DoesNotFit, MemoryPlan, ModelNeeds, budget, plan
from nmt_serve.engine.weights_dir import weights_room
from nmt_serve.network.checkpoint_info import CheckpointInfo, read_info
from nmt_serve.network.routing import DEFAULT_CPU_COST_LIMIT, preferred_names
from nmt_serve.text.language_codes import public_directions

if TYPE_CHECKING:
    from nmt_serve.inference.translator import Translator

log = logging.getLogger("nmt_serve.engine.loader")


def discover(models_dir: str | Path) -> list[Path]:
    """Checkpoint directories directly under models_dir (or models_dir itself if it is one)."""
    root = Path(models_dir)
    if (root / "config.json").is_file():
        return [root]
    if not root.exists():
        raise FileNotFoundError(f"models directory not found: {root}")
    if not root.is_dir():
        raise NotADirectoryError(f"not a directory (nor a checkpoint's): {root}")
    found = sorted(p for p in root.iterdir() if (p / "config.json").is_file())
    if not found:
        raise FileNotFoundError(f"no checkpoints (subdirectories with config.json) in {root}")
    return found


def nvidia_visible() -> str | None:
    """Why this machine looks as if it has an NVIDIA GPU for us (a device node, or CUDA_VISIBLE_DEVICES
    naming devices), or None: device=auto falling back to the CPU there is worth a warning."""
    if Path("/dev/nvidia0").exists():
        return "/dev/nvidia0 exists"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible != "-1":
        return f"CUDA_VISIBLE_DEVICES={visible}"
    return None


def device_problem(device: str) -> str | None:
    """Why `device` (cuda or cuda:N) cannot serve, or None when it can (and always for cpu/auto)."""
    if not device.startswith("cuda"):
        return None
    import torch

    # is_available() says only False; the reason (driver too old, no device) is in the warning it raises
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if not available:
        if torch.version.cuda is None:
            return f"this torch build ({torch.__version__}) has no CUDA support"
        reasons = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
        return reasons[0] if reasons else (f"no CUDA device or NVIDIA driver found (torch {torch.__version__}, "
                                              f"built for CUDA {torch.version.cuda})")
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        return f"{device}: only {torch.cuda.device_count()} CUDA device(s) visible"
    return None


def engine_device(device: str, index: int, engines: int, gpus: int) -> tuple[str, int]:
    """Where engine `index` of `engines` runs, and how many of them share that device (each takes that share of its
    memory): on a node with several GPUs, a device that names none ("cuda", or "auto" where CUDA is) puts engine i on
    GPU i mod the GPUs' count, one server over all of them; a named GPU, or the CPU, holds them all."""
    if gpus > 1 and device in ("cuda", "auto"):
        gpu = index % gpus
        return f"cuda:{gpu}", len(range(gpu, engines, gpus))
    return device, engines


def model_names(kinds: dict[Path, tuple[bool, str]]) -> dict[Path, str]:
    """Each checkpoint's model id, from {path: (multilingual, its pair)}: a multilingual checkpoint's directory
    name, a bilingual one's pair unless another checkpoint has the same pair (then its directory name: an
    OPUS-MT de-en beside the shipped de-en)."""
    pair_counts = Counter(pair for multilingual, pair in kinds.values() if not multilingual)
    names = {path: pair if not multilingual and pair_counts[pair] == 1 else path.resolve().name
             for path, (multilingual, pair) in kinds.items()}
    twice = [n for n, count in Counter(names.values()).items() if count > 1]
    if twice:
        raise ValueError(f"two checkpoints are called {twice[0]}: {', '.join(str(p) for p, n in names.items() if n == twice[0])}")
    return names


def resolve_prefer(prefer: str, names: dict[Path, str], models_dir: str | Path) -> list[str]:
    """Settings.prefer as model ids, in its order; each item names a model or its checkpoint's directory, and one
    that names neither is a ValueError."""
    aliases = {path.name: name for path, name in names.items()}  # as the models directory lists it (the API has the same)
    unknown = [p for p in preferred_names(prefer) if p not in aliases and p not in names.values()]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: no checkpoint in {models_dir} is called that "
                         f"(models: {', '.join(sorted(names.values()))})")
    return preferred_names(prefer, aliases)


def check_prefer(models_dir: str | Path, prefer: str) -> None:
    """resolve_prefer's check alone, before the engine starts: from each checkpoint's config.json (read_info,
    which the API process can run without torch)."""
    if not prefer.strip():
        return
    kinds = {}
    for path in discover(models_dir):
        info = read_info(path)
        kinds[path] = (info.multilingual, f"{info.source_lang}-{info.target_lang}")
    resolve_prefer(prefer, model_names(kinds), models_dir)


UNLOADED_DIRECTIONS_LISTED = 64  # of an unloaded checkpoint's directions, in /v1/models


@dataclass
class LoadPlan:
    """Which checkpoints of a models directory the engine loads, and why the others are left."""
    chosen: dict[Path, tuple[str, CheckpointInfo]]  # path -> (model id, its info)
    unloaded: list[dict] = field(default_factory=list)  # {model, path, directions, direction_count, served_by, reason}: /v1/models


def plan_loads(models_dir: str | Path, device: str = "cpu", cpu_cost_limit: float = DEFAULT_CPU_COST_LIMIT,
               prefer: str = "") -> LoadPlan:
    """The checkpoints to load, with their model ids: every one found that serves some direction (network.routing:
    those `prefer` names first, then by scores; on CPU among those within cpu_cost_limit of the cheapest one's work
    per token). A multilingual checkpoint's id is its directory's name (the API routes its directions to it), a
    bilingual one's its pair, or its directory's name where another checkpoint has the same pair. `prefer` may
    name either; a name of no checkpoint here is a ValueError."""
    from nmt_serve.inference.translator import resolve_device
    from nmt_serve.network.routing import Offer, decode_cost, route

    paths = discover(models_dir)
    infos = {path: read_info(path) for path in paths}
    names = model_names({p: (info.multilingual, f"{info.source_lang}-{info.target_lang}") for p, info in infos.items()})
    preferred = resolve_prefer(prefer, names, models_dir)
    costs = {p: decode_cost(info.config) for p, info in infos.items()}
    # as the API names them: a model with language codes by each code's ISO 639-1 name where it has one of its own
    served = {p: public_directions(info.served(), info.language_codes) for p, info in infos.items()}
    offers = [Offer(names[p], d, info.test_scores().get(d, {}), info.multilingual, costs[p]) for p, info in infos.items() for d in served[p]]
    limit = cpu_cost_limit if resolve_device(device).type == "cpu" else 0.0
    # a checkpoint whose every direction another one serves better would only take memory and load time
    routes = route(offers, limit, preferred)
    by_score = route(offers)
    plan = LoadPlan({})
    for path in paths:
        if names[path] in routes.values():
            plan.chosen[path] = (names[path], infos[path])
            continue
        better = sorted({routes[d] for d in served[path]})
        reasons = ["prefer names " + ", ".join(b for b in better if b in preferred)] if set(better) & set(preferred) else []
        others = [b for b in better if b not in preferred]
        if others and names[path] in by_score.values():
            cheapest = min(costs[p] for p in paths if names[p] in others)
            reasons.append(f"on CPU its work per token is {costs[path] / cheapest:.1f}x theirs, over cpu_cost_limit {limit:g} "
                           "(network/routing.py)")
        elif others:
            reasons.append("the better recorded test scores (network/routing.py)")
        why = "; ".join(reasons)
        if not infos[path].test_scores():
            why += (f"; it has none (a converted model): measure its card (python -m nmt_serve.training.model_card) "
                    f"or name it in prefer (NMT_PREFER={path.name})")
        log.info("not loading %s from %s: every direction it serves goes to %s: %s", names[path], path, ", ".join(better), why)
        # NLLB-200 serves 40,602: the list goes out with every status
        plan.unloaded.append(dict(model=names[path], path=str(path), directions=served[path][:UNLOADED_DIRECTIONS_LISTED],
                                  direction_count=len(served[path]), served_by=better, reason=why))
    return plan


def choose(models_dir: str | Path, device: str = "cpu", cpu_cost_limit: float = DEFAULT_CPU_COST_LIMIT,
           prefer: str = "") -> dict[Path, tuple[str, CheckpointInfo]]:
    """plan_loads' checkpoints to load."""
    return plan_loads(models_dir, device, cpu_cost_limit, prefer).chosen


def plan_memory(chosen: dict[Path, tuple[str, CheckpointInfo]], device: str, dtype: str | None, quantization: str = "none", *,
                budget_gb: float = 0.0, max_batch_sentences: int = 0, max_batch_tokens: int = 4096, engines: int = 1,
                weights_dir: str = "") -> MemoryPlan:
    """What the chosen models and their running sentences will hold (memory_plan.py), before any loads, in one of
    `engines` engine processes; DoesNotFit (one line) when not even one sentence fits. weights_dir: where the
    engines on the CPU map one copy of the weights (engine/weights_dir.py), each then counting its share of them,
    if the directory has room for every model's (else each engine will keep its own copy: share_weights)."""
    import torch

    from nmt_serve.engine.core import AUTO_BATCH_SENTENCES, WARMUP_BEAMS
    from nmt_serve.inference.model_runner import lone_row_threads
    from nmt_serve.inference.translator import (
        STATIC_LENGTH,
        resolve_device,
        resolve_dtype,
    )

    resolved = resolve_device(device)
    dtype_name = str(resolve_dtype(dtype, resolved)).removeprefix("torch.")

    def needs(packed: bool, shared_by: int) -> list[ModelNeeds]:
        return [ModelNeeds(name, info.config, dtype_name, quantization, beams=WARMUP_BEAMS,
                           max_length=min(STATIC_LENGTH, info.config.max_positions), device=resolved.type, packed_weights=packed,
                           lone_row_threads=lone_row_threads(torch.get_num_threads(), packed=packed, quantization=quantization)
                           if resolved.type == "cpu" else 0, shared_by=shared_by)
                for name, info in chosen.values()]

    shared_by = engines if weights_dir and resolved.type == "cpu" and engines > 1 else 1
    if shared_by > 1:
        plain = sum(n.weights_split()[0] for n in needs(True, shared_by))  # packed or not: lone rows' blocks at most
        room = weights_room(weights_dir)
        if room < plain:
            log.warning("%s has room for %.0f MB of the %.0f MB of weights the engines would share: the plan counts a copy "
                        "per engine", weights_dir, room / 1e6, plain / 1e6)
            shared_by = 1

    def planned(packed: bool) -> MemoryPlan:
        return plan(needs(packed, shared_by), budget_bytes=budget_bytes, budget_source=source,
                    max_batch_sentences=max_batch_sentences or AUTO_BATCH_SENTENCES[resolved.type], max_batch_tokens=max_batch_tokens)

    budget_bytes, source = budget(budget_gb, str(resolved), engines)
    memory = planned(False)
    # packed weights are faster but a second copy: they load only where they cost no running sentence
    if resolved.type == "cpu" and quantization == "none" and dtype_name in ("float32", "bfloat16"):
        try:
            packed = planned(True)
        except DoesNotFit:
            packed = None
        if packed is not None and packed.sentences == memory.sentences:
            memory = packed
        else:
            log.info("weights not packed for oneDNN: their copy would leave fewer running sentences in the memory budget")
    log.info("memory plan: %d running sentences per model and beam size; %.2f GiB of a budget of %.2f GiB (%s)",
             memory.sentences, memory.planned_bytes / GIB, memory.budget_bytes / GIB, memory.budget_source)
    return memory


def share_model_weights(translator: Translator, model_id: str, path: Path, weights_dir: str) -> None:
    """The translator's runner on the copy of its weights the server's engines share (inference/shared_weights.py),
    at the version of the checkpoint's file as it is now: a model replaced in the directory is another file, and the
    first engine to map the new one removes the old (the engines still running on it keep their mapping)."""
    from nmt_serve.inference.shared_weights import share_weights  # torch: only the engine process pays for it

    stat = (path / "model.safetensors").stat()
    if shared := share_weights(translator.runner, weights_dir, model_id, f"{stat.st_size}-{stat.st_mtime_ns}"):
        log.info("%s: %.0f MB of weights shared with the other engines (%s)", model_id, shared.shared_bytes / 1e6, shared.path)


def load_models(models_dir: str | Path, device: str, dtype: str | None, quantization: str = "none",
                step_mode: str = "auto", *, chosen: dict[Path, tuple[str, CheckpointInfo]] | None = None,
                static_rows: int = 1024, memory: MemoryPlan | None = None,
                on_load: Callable[[str, int], None] | None = None, weights_dir: str = "") -> dict[str, tuple[Translator, float, str]]:
    """{"de-en": (translator, load seconds, checkpoint path)} for the chosen checkpoints (default: choose() on
    this device).
    static_rows: each Translator's own static decoder (0 for the engine, whose decoders are its own).
    memory: the plan, which says whether each model's weights are packed (default: packed).
    on_load: called with each model's id, and how many were loaded before it, as it begins to load.
    weights_dir: where the server's engines keep one copy of each model's weights (engine/weights_dir.py); "" for
    none."""
    from nmt_serve.inference.attention import attention_backend
    from nmt_serve.inference.translator import (
        Translator,  # torch: only the engine process pays for it
    )

    if device.startswith("cuda") and (problem := device_problem(device)):
        raise RuntimeError(f"device {device} is not usable: {problem}")
    if device == "auto" and (gpu := nvidia_visible()) and (problem := device_problem("cuda")):
        log.warning("device=auto: an NVIDIA GPU seems present (%s) but CUDA is not usable (%s); serving on the CPU", gpu, problem)
    models: dict = {}
    for path, (model_id, _) in (choose(models_dir, device) if chosen is None else chosen).items():
        if on_load is not None:
            on_load(model_id, len(models))
        t0 = time.perf_counter()
        # no warm-up capture here: the engine captures its own device searches' graphs (EngineCore.warmup)
        packed = memory.models[model_id]["packed_weights"] if memory is not None else True
        translator = Translator.load(path, device=device, dtype=dtype, quantization=quantization, step_mode=step_mode,
                                     static_rows=static_rows, warmup=False, packed_weights=packed)
        if weights_dir and translator.device.type == "cpu":
            share_model_weights(translator, model_id, Path(path), weights_dir)
        models[model_id] = (translator, time.perf_counter() - t0, str(path))
        log.info("loaded %s from %s: device %s, dtype %s, attention %s (%.2fs)", model_id, path, translator.device,
                 str(translator.dtype).removeprefix("torch."), attention_backend(translator.device), models[model_id][1])
    return models
