"""All service settings in one place: flags of `python -m nmt_serve.service`, or environment variables NMT_*."""
from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from nmt_serve.network.routing import DEFAULT_CPU_COST_LIMIT


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NMT_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0 = any free port)")
    models_dir: str = Field("checkpoints", description="directory whose subdirectories are checkpoints, one per language pair")
    device: str = Field("auto", pattern="^(auto|cpu|cuda(:[0-9]+)?)$", description="auto | cpu | cuda")
    cpu_cost_limit: float = Field(DEFAULT_CPU_COST_LIMIT, ge=0, description="on CPU, where several models serve a direction, "
                                  "one whose work per token is more than this many times the cheapest one's does not serve it, "
                                  "whatever its test scores (a sentence's latency grows with it); 0: by test scores alone")
    prefer: str = Field("", description="comma-separated models (a checkpoint directory's name, or the model's name in "
                        "/v1/models) that serve every direction they can before any other, the first named first, "
                        "whatever the test scores and cpu_cost_limit; a converted OPUS-MT or NLLB-200 model has no scores "
                        "on this project's test sets, so without this it does not take a direction a scored model serves")
    pivot_language: str = Field("en", description="a direction no model serves is translated through this language where models "
                                "translate the source into it and it into the target (two translations: slower, and errors "
                                "add up); '' for none")
    dtype: str | None = Field(None, pattern="^(float32|float16|bfloat16)$", description="default: float32 on CPU, float16 on CUDA")
    quantization: str = Field("none", pattern="^(none|int8)$",
                              description="int8: quantized Linear layers (CPU, float32), faster at a small BLEU cost")
    step_mode: str = Field("auto", pattern="^(auto|eager|static)$",
                           description="auto: the static decoder (CUDA graphs, search on the device) on CUDA, the eager search on CPU; "
                                       "eager: always the eager search")
    threads: int = Field(0, ge=0, description="torch CPU threads of each engine lane (0: 1 where there are several lanes or "
                                              "engines, and a search that steps alone takes the usable cores other "
                                              "processes leave idle; else torch's default)")
    lanes: int = Field(0, ge=0, description="CPU: decode loops per model and beam size whose steps run side by side, each "
                                            "with `threads` torch threads (0: the usable cores, from the CPU affinity and "
                                            "the cgroup's CPU quota); on CUDA always 1")
    engine_nice: int = Field(0, ge=0, le=19, description="scheduling niceness of the engine process; above 0 it yields its "
                                                         "cores to every ordinary process on the node (beside busy "
                                                         "neighbours it then starves)")

    # processes
    workers: int = Field(1, ge=1, description="API worker processes in front of the engine processes")
    engines: int = Field(1, ge=1, le=16, description="engine processes, each with the models, its share of the memory "
                                                     "budget and of the CPU cores; an API process sends each call to the "
                                                     "ready engine with the least of its work in flight (source tokens), and "
                                                     "a call whose engine is lost goes once to another. On a GPU one engine's loop (Python, one "
                                                     "core) can leave the device idle: several share it; on a node with "
                                                     "several GPUs (device cuda or auto) engine i runs on GPU i mod their count")
    shared_weights: bool = Field(True, description="with several engines on the CPU: one copy of each model's weights, mapped "
                                                   "by every engine from a file in /dev/shm (or the temporary directory), "
                                                   "instead of a copy each: each engine after the first holds 52 MB less of "
                                                   "the shipped model (321 MB at OPUS-MT's shape). Where the directory has "
                                                   "no room, an engine keeps its own copy")
    engine_socket_dir: str = Field("", description="internal: the socket directories of the engines run by a parent process, "
                                                   "joined by the path separator (set for the workers when workers > 1)")
    engine_heartbeat_timeout_s: float = Field(30.0, gt=0, description="no status for this long from a live engine process: "
                                                                      "it is stuck: waiting requests get 503, and the "
                                                                      "engine is killed and restarted (an engine process "
                                                                      "that exits is noticed within 0.25 s, whatever this says)")
    engine_stall_s: float = Field(5.0, ge=0, description="with several engines: one silent this long (stopped, starved of "
                                                         "CPU, stuck) has the calls it holds sent to another that still "
                                                         "answers, each call once; it drops their work when it runs again "
                                                         "(0: calls wait for the engine or its heartbeat)")

    # continuous batching (in the engine process)
    max_batch_sentences: int = Field(0, ge=0, description="sentences running at once per model and beam size "
                                                          "in each engine (0: 64 on CPU, 256 on CUDA)")
    max_batch_tokens: int = Field(4096, ge=1, description="source tokens that may join the running batch at one step")
    memory_budget_gb: float = Field(0.0, ge=0, description="memory (GiB) the engine's models and running sentences may take on "
                                                           "their device: weights, then a reserve for joins, then as many running "
                                                           "sentences as fit, up to max_batch_sentences; models that do not fit "
                                                           "are refused at start-up (0: 90% of the device's free memory); engines "
                                                           "on one device take an equal share of it each")
    max_queue_sentences: int = Field(2048, ge=1, description="sentences waiting or running at most (the server's: each engine takes "
                                                             "its share); beyond it requests get 503")
    batching: bool = Field(True, description="false: a batch runs one request at a time (for comparison)")
    admission: bool = Field(True, description="refuse (503) requests whose predicted wait, from the work queued ahead and the "
                                              "measured engine rate, would pass their deadline; false: bound the queue by sentences only")
    admission_margin: float = Field(0.8, gt=0, le=1, description="share of a request's deadline the predicted wait may take")
    admission_rate: float = Field(0.0, ge=0, description="decode units per second admission starts from, for example the "
                                                         "nmt_engine_rate_units_per_second of an earlier run on the same kind "
                                                         "of node; 0: measured by a calibration of up to about 2 s at every "
                                                         "engine start. Either way the rate then follows the engine's work")

    # limits per request
    max_texts_per_request: int = Field(64, ge=1)
    max_chars_per_text: int = Field(20000, ge=1, description="characters per text (a text may be paragraphs or an HTML page)")
    max_tokens_per_text: int = Field(8192, ge=1, description="source tokens per text, all its sentences together")
    max_sentence_tokens: int = Field(48, ge=4, description="a sentence longer than this many source tokens is cut at clause "
                                                           "punctuation, else between words, and translated in pieces "
                                                           "(the shipped models saw at most ~40 in training and stop early past it)")
    attention_check: str = Field("borderline", pattern="^(borderline|all|off)$",
                                 description="the `detached` quality flag reads the model's attention over a translation, "
                                             "kept by the engine's search as it translates, else a forced decoding of "
                                             "it in the engine: borderline: for sentences whose score is "
                                             "between low_confidence's threshold and -0.4 (about a third of in-domain ones); "
                                             "all: for every sentence; off: never (only /v1/translate checks, and not in jobs)")
    language_detection: bool = Field(True, description="source \"auto\" and /detect (lingua's detectors and py3langid's second "
                                                       "opinion, built before readiness: seconds and some 200 MB per API worker); false: "
                                                       "a request must name its source language (\"auto\" and /detect answer 400), and "
                                                       "neither is loaded")
    language_detection_accuracy: str = Field("high", pattern="^(high|low)$",
                                             description="lingua's mode for the served source languages: high accuracy "
                                                         "tells short texts apart best but, over the 75 languages a converted "
                                                         "NLLB-200 serves, took 7.8 s to build, +1.24 GB per API worker and "
                                                         "4-5 ms a text; low: 0.2 s, +36 MB, 1.3-1.7 ms, and 1 in 25 English "
                                                         "captions taken for another language (README: language detection)")
    translation_cache_entries: int = Field(0, ge=0, description="sentences' translations kept (the least recently used go "
                                           "first) to answer a sentence asked for again with the same model and options "
                                           "without a search: by the API worker itself where workers = 1, by the engines for all "
                                           "of them where there are several (with several engines, each keeps the content "
                                           "that is its own: a call goes to its content's engine while that one is not much "
                                           "busier than the others); a sentence asked for while another request has it in the engine "
                                           "takes that request's answer; 0 = off (a sentence repeated within one request "
                                           "is translated once either way). About 1 KB each")
    max_beam_size: int = Field(8, ge=1)
    max_output_length: int = Field(512, ge=1, description="upper bound for max_length in a request")
    request_timeout_s: float = Field(30.0, gt=0, description="a request still waiting after this gets 504")
    retry_after_s: int = Field(1, ge=0, description="Retry-After header sent with 503")
    max_body_bytes: int = Field(1_000_000, ge=1, description="request bodies larger than this get 413")
    max_file_bytes: int = Field(20_000_000, ge=1, description="an uploaded file (/translate_file, /v1/translate_file: these two "
                                                             "take bodies up to this size instead of max_body_bytes)")
    max_document_chars: int = Field(100_000, ge=1, description="characters of text in one uploaded document (.docx, .pptx, .xlsx, .odt, "
                                                               ".odp, .epub, .srt, .vtt, .po, .xlf, .xliff, .md), all its paragraphs together, translated in "
                                                               "the request (/translate_file makes a larger one a job)")
    sync_file_chars: int = Field(20_000, ge=0, description="LibreTranslate's /translate_file translates a .txt file or a document "
                                                           "of up to this many characters in the request; a larger one (or one "
                                                           "past max_chars_per_text / max_document_chars) becomes a job, its "
                                                           "download answering 202 with the progress (after "
                                                           "file_download_wait_s) until it is done")
    file_download_wait_s: float = Field(20.0, ge=0, description="the download of a /translate_file job's file waits this long "
                                                                "for the job to end before answering 202 with its progress (a "
                                                                "client that fetches the URL once gets the file of a job that "
                                                                "ends meanwhile; ?wait=0 answers at once; browsers never wait)")
    graceful_shutdown_s: float = Field(30.0, ge=0, description="on SIGTERM, how long in-flight requests may take to finish")
    # how slowly a body may come: a client that trickles one ("slowloris") holds a connection and a request
    # for as long as it is let (as Apache's mod_reqtimeout body=20,MinRate=500); uvicorn has no such bound
    body_timeout_s: float = Field(30.0, gt=0, description="a request's body must start within this many seconds and never "
                                                          "pause longer; else 408 and the connection is closed")
    body_min_rate: float = Field(500.0, gt=0, description="past body_timeout_s, a body must have come at this many bytes/s "
                                                          "on average; else 408 and the connection is closed")
    keep_alive_s: float = Field(5.0, gt=0, description="an idle keep-alive connection is closed after this many seconds")
    header_timeout_s: float = Field(20.0, gt=0, description="a request's line and headers must have come this many seconds "
                                                            "after the connection opened (or the request began); else the "
                                                            "connection is closed")
    max_header_bytes: int = Field(65536, ge=1024, description="a request's line and headers (the URL, every header's name and "
                                                              "value) at most; past it 431 and the connection is closed")
    max_connections: int = Field(0, ge=0, description="connections open at once per API process at most (each worker's); "
                                                      "past it a request is answered 503 at once; 0: no limit")

    # jobs (POST /v1/jobs): many texts translated in the background, with progress, surviving restarts
    jobs_dir: str = Field("", description="directory where jobs and their results are kept, shared by the API workers "
                                          "(empty: nmt-serve-jobs-<uid> in the system's temporary directory)")
    max_glossary_entries: int = Field(10_000, ge=1, description="entries of one stored glossary (POST /v1/glossaries) at most")
    max_glossaries: int = Field(1_000, ge=1, description="stored glossaries per API key (per server without keys) at most")
    max_job_texts: int = Field(100_000, ge=1, description="texts in one job at most; beyond it 413")
    max_job_bytes: int = Field(16_000_000, ge=1, description="request body of POST /v1/jobs at most (bytes); beyond it 413")
    job_chunk_texts: int = Field(16, ge=1, description="texts a job sends to the engine per call (a chunk's results are "
                                                       "written to the job directory before the chunk counts as done)")
    job_chunk_timeout_s: float = Field(300.0, gt=0, description="deadline of one chunk in the engine; past it the chunk is sent again")
    job_ttl_s: float = Field(86400.0, gt=0, description="a finished, failed or cancelled job is removed this long after it ended")
    background_share: float = Field(0.25, gt=0, le=1, description="share of the running sentences per model and beam size "
                                                                  "that jobs may hold (at least one); jobs join only while no "
                                                                  "interactive sentence waits")

    # access control
    api_keys: str = Field("", description="comma-separated API keys; empty = no authentication")
    api_keys_file: str = Field("", description="file with one API key per line (keeps keys out of the process list)")
    metrics_token: str = Field("", description="if set, /metrics needs 'Authorization: Bearer <token>'")
    rate_limit_per_minute: int = Field(0, ge=0, description="requests per minute per API key (or client address without keys); 0 = off")
    cors_origins: str = Field("", description="comma-separated origins allowed by CORS; empty = none (closed)")

    def engine_config(self, index: int = 0, weights_dir: str = "") -> dict:
        """What engine process `index` (of `engines`) needs (plain JSON; no keys or other secrets); weights_dir: the
        directory of the engines' shared weights (engine/weights_dir.py), "" for none."""
        import logging

        names = ("models_dir", "device", "cpu_cost_limit", "prefer", "dtype", "quantization", "step_mode", "threads", "lanes", "engine_nice",
                 "max_batch_sentences", "max_batch_tokens", "memory_budget_gb", "max_queue_sentences", "batching", "admission",
                 "admission_margin", "admission_rate", "retry_after_s", "graceful_shutdown_s", "background_share", "engine_heartbeat_timeout_s")
        # the engine runs in the repository's directory: a relative models_dir means this process's directory
        return dict({n: getattr(self, n) for n in names}, models_dir=str(Path(self.models_dir).resolve()), engines=self.engines, engine_index=index,
                    weights_dir=weights_dir,
                    # the server's bound on waiting and running sentences, shared by its engines
                    max_queue_sentences=-(-self.max_queue_sentences // self.engines),
                    log_level=logging.getLevelName(logging.getLogger().level).lower(),
                    translation_cache_entries=self.engine_cache_entries)

    @property
    def engine_dirs(self) -> list[str]:
        """The socket directories of the engines a parent process runs (workers > 1), the first also the private
        directory the workers share (their rate limit's table, LibreTranslate's uploaded files); [] in a lone API
        process, which runs its engines itself."""
        return [d for d in self.engine_socket_dir.split(os.pathsep) if d]

    @property
    def engine_cache_entries(self) -> int:
        """The translations each engine keeps: for every worker where there are several (a call goes to its content's
        own engine, EnginePool.pick, where a repeat finds it), none where a lone worker keeps its own."""
        return self.translation_cache_entries if self.workers > 1 else 0

    @property
    def api_cache_entries(self) -> int:
        """The translations an API worker keeps itself: all of them where it is the only one (no call to the
        engine for a repeat), none where several share the engine's cache."""
        return self.translation_cache_entries if self.workers == 1 else 0

    def keys(self) -> list[str]:
        keys = [k.strip() for k in self.api_keys.split(",") if k.strip()]
        if self.api_keys_file:
            with open(self.api_keys_file, encoding="utf-8") as f:
                keys += [line.strip() for line in f if line.strip() and not line.startswith("#")]
        return keys

    def origins(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]


def unknown_variables(environ: dict[str, str]) -> tuple[list[str], list[str]]:
    """NMT_* variables that are no setting: (lines for those that look like a misspelt one, lines for
    the rest). pydantic ignores them, so a typo would otherwise leave its setting at its default."""
    import difflib

    names = {f"NMT_{n.upper()}" for n in Settings.model_fields}
    misspelt, other = [], []
    for variable in sorted(v for v in environ if v.startswith("NMT_") and v not in names):
        if close := difflib.get_close_matches(variable, names, n=1, cutoff=0.8):
            misspelt.append(f"{variable} is not a setting: did you mean {close[0]}?")
        else:
            other.append(f"{variable} is not a setting of the service; ignored")
    return misspelt, other

