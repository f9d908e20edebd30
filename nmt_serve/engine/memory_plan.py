"""What the engine's models and their decoders will hold in memory, planned before anything loads.

The budget (`memory_budget_gb`; 0: what the device has free at start-up, less a tenth) is spent in
this order (a server of several engine processes gives each an equal share: `budget`):
1. the weights of every model that will load (counted from its config, at the dtype it runs in;
   int8 adds its packed copy of every Linear weight beside the float ones, and of the output layer's a
   second one in oneDNN's layout for large batches; oneDNN's packed float weights on the CPU add one
   (the model's own weights then live in the runner's transposed copies for a lone row; small weights'
   column blocks at more than 1 thread are copies of their own), and load only where they cost no
   running sentence: plan_memory); engines on the CPU that map one copy of the plain tensors (shared_weights.py)
   each count their share of those, and their packed copies whole;
2. a reserve for joining sentences: the encoder's activations and the cross-attention keys/values of
   `max_batch_tokens` source tokens, made before they are copied into a decoder's rows;
3. the running sentences, the same number S for every model and start-up beam size, the most that
   fits up to `max_batch_sentences`. A row (one beam of one sentence) holds the keys/values of
   self- and cross-attention of every decoder layer over `max_length` positions:
       2 (self, cross) x n_layers x 2 (k, v) x H x max_length x D  elements
   (on CUDA a beam size's decoder holds the source's once for a sentence's K rows: 1 + 1/K instead of 2),
   and a step's work space per row: its logits and their float32 log-probabilities, and in beam
   search the candidates' float32 scores, over the whole vocabulary (V x (itemsize + 4) bytes
   greedy, V x (itemsize + 8) beam: with a 256k vocabulary, 3% of a row's keys/values); and the
   device search's state (device_search.SearchSlots: each row's tokens and kept attention over
   `max_length` positions, in beam search the finished hypotheses' too; the eager search holds less).
With the static decoder (CUDA) the rows are fixed buffers and the work space lives in the CUDA
graphs' pool; in the eager search (CPU) the cache grows with the sentences, and the plan bounds it
at `max_length`. A plan that leaves less than one sentence is refused in one line, before a model
loads. The plan and, after warm-up, what the device really holds go into /v1/models.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nmt_serve.network.config import ModelConfig

GIB = 2**30
AUTO_SHARE = 0.9  # of the free memory, when no budget is set: the rest for the allocator's rounding and the CUDA context
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class DoesNotFit(ValueError):
    """The models do not fit the memory budget; the message is one line that says by how much."""


@dataclass
class ModelNeeds:
    """What one model will hold, from its config and how it runs."""

    model_id: str
    config: ModelConfig
    dtype: str  # float32 | float16 | bfloat16
    quantization: str = "none"
    beams: tuple[int, ...] = (1, 4)  # beam sizes with rows of their own from the start (static decoders; eager: the common ones)
    max_length: int = 256  # positions of source and target a row holds
    device: str = "cpu"  # cpu | cuda: what the runner adds beside the weights differs
    packed_weights: bool = False  # CPU: every Linear weight also held prepacked for oneDNN (model_runner.FloatLinear)
    lone_row_threads: int = 0  # packed float weights also laid out for a lone row on this many threads
    shared_by: int = 1  # CPU engine processes that map one copy of the plain tensors (weights_split)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def parameters(self) -> tuple[int, int]:
        """(all parameters, those in Linear weights), tied tensors once, counted on the meta device."""
        import torch

        from nmt_serve.network.transformer import Transformer

        with torch.device("meta"):
            model = Transformer(self.config)
        total = model.num_parameters()
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight is not model.output_proj.weight)
        return total, linear + model.output_proj.weight.numel()

    def weights_split(self) -> tuple[int, int]:
        """(bytes in plain tensors, bytes in packed ones): the model's parameters (and small weights' column blocks
        for a lone row: lone_row_elements; int8's plain values for a row or two: row_products), and what its
        runner packs beside them: int8's packed weights (the output layer's twice, fbgemm's and oneDNN's, where
        oneDNN's int8 kernel is exact on this CPU), or the float Linear weights' packed copies for oneDNN. Engine
        processes on the CPU can map the plain tensors from one copy (shared_weights.py); packed ones are opaque,
        each engine's own."""
        total, linear = self.parameters()
        if self.quantization == "int8":
            from nmt_serve.inference import row_products
            from nmt_serve.inference.model_runner import onednn_int8_runs, step_linear_shapes

            second = self.config.tgt_vocab_size * self.config.d_model if onednn_int8_runs() else 0
            # the decoder step's int8 values as they are for a row or two (row_products), a scale and a bias per output
            rows = sum(o * i + 8 * o for o, i in step_linear_shapes(self.config)
                       if o * i <= row_products.INT8_MAX_BYTES) if row_products.available() else 0
            return total * self.itemsize + rows, linear + second
        if not self.packed_weights:
            return total * self.itemsize, 0
        from nmt_serve.inference.model_runner import lone_row_elements

        lone_row = lone_row_elements(self.config, self.lone_row_threads, float32=self.dtype == "float32") if self.lone_row_threads else 0
        return (total + lone_row) * self.itemsize, linear * self.itemsize

    def weights_bytes(self) -> int:
        """This engine's part of the weights: its packed copies, and its share of the plain tensors (shared_by)."""
        plain, packed = self.weights_split()
        return -(-plain // self.shared_by) + packed

    def row_bytes(self, beam: int = 1) -> int:
        """A row's keys and values: its target's, and its source's, which on CUDA the K rows of a sentence share
        (the static decoder of one beam size: static_decoder.py's `group`); the eager search (CPU) counts a copy
        per row, what it holds below GROUPED_BEAM_MIN_ROWS."""
        c = self.config
        per = c.n_decoder_layers * 2 * c.n_heads * self.max_length * c.head_dim * self.itemsize  # self or cross
        return per + (-(-per // beam) if self.device == "cuda" else per)

    def step_bytes_per_row(self, beam: int) -> int:
        return self.config.tgt_vocab_size * (self.itemsize + (4 if beam == 1 else 8))

    def search_bytes_per_row(self, beam: int) -> int:
        """device_search.SearchSlots for beams of this size, with the kept attention made, per row."""
        T = self.max_length
        # score, min/max length, forced token, attention span; tokens (long), entropy and look (4 bytes each)
        row = 4 + 3 * 8 + 2 * 8 + T * (8 + 4 + 4)
        # per sentence: alive; in beam search 2K + 1 finished slots (score, length, unmet, tokens, entropy,
        # look), their count, its first row, the fresh beams' scores
        group = 1 if beam == 1 else 1 + (2 * beam + 1) * (4 + 8 + 1 + T * (8 + 4 + 4)) + 8 + 8 + 4 * beam
        return row + -(-group // beam)

    def rows_bytes(self, beam: int, rows: int) -> int:
        return rows * (self.row_bytes(beam) + self.step_bytes_per_row(beam) + self.search_bytes_per_row(beam))

    def sentence_bytes(self) -> int:
        """What one more running sentence costs: its rows in every start-up beam size's decoder."""
        return sum(self.rows_bytes(beam, beam) for beam in self.beams)

    def join_bytes(self, max_batch_tokens: int) -> int:
        c = self.config
        activations = max_batch_tokens * (4 * c.d_model + c.d_ff) * self.itemsize
        cross = max_batch_tokens * c.n_decoder_layers * 2 * c.d_model * self.itemsize
        return activations + cross


@dataclass
class MemoryPlan:
    budget_bytes: int
    budget_source: str  # "setting" or where the free memory was read
    sentences: int  # running sentences per model and beam size
    models: dict[str, dict] = field(default_factory=dict)  # id -> weights_bytes, rows, bytes per beam size
    planned_bytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def plan(needs: list[ModelNeeds], *, budget_bytes: int, budget_source: str, max_batch_sentences: int,
         max_batch_tokens: int) -> MemoryPlan:
    """The most running sentences (<= max_batch_sentences) that fit the budget; DoesNotFit if not one."""
    weights = {n.model_id: n.weights_bytes() for n in needs}
    join = max((n.join_bytes(max_batch_tokens) for n in needs), default=0)  # joins run one at a time
    per_sentence = sum(n.sentence_bytes() for n in needs)
    room = budget_bytes - sum(weights.values()) - join
    sentences = min(max_batch_sentences, room // per_sentence) if per_sentence else max_batch_sentences
    if sentences < 1:
        smallest = sum(weights.values()) + join + per_sentence
        parts = ", ".join(f"{m} weights {weights[m] / GIB:.2f} GiB" for m in weights)
        raise DoesNotFit(
            f"the models do not fit the memory budget of {budget_bytes / GIB:.2f} GiB ({budget_source}): {parts}, "
            f"joins {join / GIB:.2f} GiB and one running sentence {per_sentence / GIB:.2f} GiB need at least "
            f"{smallest / GIB:.2f} GiB; raise --memory-budget-gb (NMT_MEMORY_BUDGET_GB), lower --max-batch-tokens, or serve fewer or smaller models")
    models = {}
    for n in needs:
        decoders = {str(beam): dict(rows=sentences * beam, bytes=n.rows_bytes(beam, sentences * beam)) for beam in n.beams}
        models[n.model_id] = dict(weights_bytes=weights[n.model_id], weights_shared_by=n.shared_by, packed_weights=n.packed_weights,
                                  max_length=n.max_length,
                                  beams=decoders)
    planned = sum(weights.values()) + join + sentences * per_sentence
    return MemoryPlan(budget_bytes=int(budget_bytes), budget_source=budget_source, sentences=int(sentences),
                      models=models, planned_bytes=int(planned))


def free_memory(device: str) -> tuple[int, int, str]:
    """(bytes free for this process on `device`, bytes it has in all, where that was read): a CUDA device's memory,
    or on the CPU the machine's available and total memory, each bounded by what the cgroup (a pod's limit) allows."""
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
        return free, total, f"free on {device}"
    available, total = _meminfo("MemAvailable"), _meminfo("MemTotal")
    source = "MemAvailable in /proc/meminfo"
    limit = _cgroup_room()
    if limit is not None and limit[0] < available:
        available, source = limit[0], "the cgroup's memory.max less its memory.current"
    if limit is not None:
        total = min(total, limit[1])
    return available, total, source


def _meminfo(field: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = "SC_AVPHYS_PAGES" if field == "MemAvailable" else "SC_PHYS_PAGES"
    return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")


def _cgroup_room() -> tuple[int, int] | None:
    """(what the cgroup's memory limit leaves, the limit), or None without a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((root / "memory.current").read_text().strip()), int(limit)
    except (OSError, ValueError):
        return None


def budget(setting_gb: float, device: str, engines: int = 1) -> tuple[int, str]:
    """The budget in bytes of one of `engines` engine processes on the device, and where it came from: its share of
    the setting, or a share of the free memory.

    The engines of a server start at once and each reads the device's free memory before the others hold much,
    so each takes at most 1/engines of the device's memory; and one that restarts beside the others finds their
    shares taken, so it takes at most what is free."""
    if setting_gb > 0:
        return int(setting_gb * GIB / engines), "--memory-budget-gb / NMT_MEMORY_BUDGET_GB" + (f", a 1/{engines} share" if engines > 1 else "")
    free, total, source = free_memory(device)
    return (int(min(free, total / engines) * AUTO_SHARE),
            f"{AUTO_SHARE:.0%} of {source}" + (f" or of 1/{engines} of the device's memory, the smaller" if engines > 1 else ""))
