"""Command-line translator: source lines on stdin, translations on stdout, one per line, in order.
Each line is cut into sentences (a line may be a paragraph) and put back together after translation.

    python -m nmt_serve.cli.translate --model checkpoints/de-en < input.de > output.en
    python -m nmt_serve.cli.translate --model checkpoints/en-de --demo
    python -m nmt_serve.cli.translate --model checkpoints/multi30k --source-lang fr --target-lang cs < input.fr
    python -m nmt_serve.cli.translate --model opus-mt-de-en --pivot en --second-model opus-mt-en-fr < input.de

--demo translates a few built-in sentences in the model's source language instead of reading stdin,
and prints each with its translation. --pivot translates into that language first and from it into the
target (with --second-model, or the same model), as the service does for a direction no model serves.
"""
from __future__ import annotations

import argparse
import os
import sys

from tqdm import tqdm

from nmt_serve.cli.common import (
    add_load_options,
    check_model,
    fail,
    load_translator,
    non_negative_int,
    positive_int,
    user_errors,
)
from nmt_serve.text.language_codes import iso_639_1, iso_aliases
from nmt_serve.text.segmentation import segment

# the shipped models saw sentences of at most ~40 tokens in training; longer ones are cut at clauses
MAX_SENTENCE_TOKENS = 48

# `make translate` with nothing piped in; one list per source language a shipped model reads
DEMO_SENTENCES = {
    "de": ["Ein Mann fährt mit dem Fahrrad durch die Stadt.", "Zwei Kinder spielen im Schnee."],
    "en": ["A man rides a bicycle through the city.", "Two children are playing in the snow."],
    "fr": ["Un homme traverse la ville à vélo.", "Deux enfants jouent dans la neige."],
    "cs": ["Muž jede na kole přes město.", "Dvě děti si hrají na sněhu."],
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nmt-translate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser)
    parser.add_argument("--beam-size", type=positive_int, default=4, help="1 = greedy (default 4)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="sentences per model batch (default 64)")
    parser.add_argument("--max-length", type=positive_int, default=None, help="cap on generated tokens (default: 1.5 x source + 10)")
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--no-repeat-ngram-size", type=non_negative_int, default=0)
    parser.add_argument("--threads", type=non_negative_int, default=0, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--progress", choices=["auto", "always", "never"], default="auto", help="progress bar on stderr (auto: when stdin is not a terminal)")
    parser.add_argument("--source-lang", help="the input's language (a multilingual model needs it, for sentence splitting)")
    parser.add_argument("--target-lang", help="the language to translate into (a multilingual model needs it)")
    parser.add_argument("--pivot", help="translate into this language first, then from it into the target language")
    parser.add_argument("--second-model", help="the model of the pivot's second translation (default: --model)")
    parser.add_argument("--demo", action="store_true", help="translate built-in sentences in the model's source language, not stdin")
    parser.add_argument("--no-split-sentences", dest="split_sentences", action="store_false",
                        help="translate each line whole instead of sentence by sentence")
    return parser


def direction(parser: argparse.ArgumentParser, model_dir: str, source: str | None, target: str | None,
              flags: tuple[str, str] = ("--source-lang", "--target-lang")) -> tuple[str, str]:
    """The (source, target) languages of this run (or of one of a pivot's translations, whose languages `flags`
    name), checked against the checkpoint before any weights load."""
    info = check_model(parser, model_dir)
    if info.language_codes:  # a language may be named by its ISO 639-1 code too (de for deu_Latn)
        aliases = iso_aliases(info.language_codes)
        source, target = aliases.get(source, source), aliases.get(target, target)
    if info.multilingual:
        # a many-to-many model's directions are every pair of its languages: name the languages
        served = f"its languages: {', '.join(info.language_codes)}" if info.language_codes else f"it serves {', '.join(info.served())}"
        if not source or not target:
            fail(parser, f"{model_dir} is multilingual: name {flags[0]} and {flags[1]} ({served})")
        if f"{source}-{target}" not in info.served():
            fail(parser, f"{model_dir} does not translate {source}->{target}; {served}")
        return source, target
    for flag, given, own in ((flags[0], source, info.source_lang), (flags[1], target, info.target_lang)):
        if given and given != own:
            fail(parser, f"{flag} {given}: {model_dir} translates {info.source_lang}->{info.target_lang}")
    return info.source_lang, info.target_lang


def demo_sentences(parser: argparse.ArgumentParser, model_dir: str, source: str) -> list[str]:
    """The demo lines in the run's source language."""
    source = iso_639_1(source) or source
    if source not in DEMO_SENTENCES:
        fail(parser, f"no demo sentences in {source!r} (the source language of {model_dir}); "
                     f"there are some in {', '.join(sorted(DEMO_SENTENCES))}: pipe your own lines in instead")
    return DEMO_SENTENCES[source]


def translate_lines(translator, lines: list[str], split_sentences: bool, options: dict, source_lang: str | None = None,
                    first_line: int = 1) -> list[str]:
    """Each line translated sentence by sentence, with all the lines' sentences in one batch; `first_line` is
    the input line number of lines[0], for the error that names a line too long for the model."""
    count = lambda text: len(translator.src_tokenizer.encode(text))  # noqa: E731
    source_lang = source_lang or translator.source_lang
    source_lang = iso_639_1(source_lang) or source_lang  # the segmenter's rules go by ISO 639-1
    cut = [segment(line, source_lang, split_sentences=split_sentences, count=count, max_tokens=MAX_SENTENCE_TOKENS)
           for line in lines]
    sentences = [s for c in cut for s in c.texts]
    try:
        translations = iter([r.text for r in translator.translate(sentences, **options)] if sentences else [])
    except ValueError as exc:
        # a word run longer than the model's positions has no cut point; the translator's message says how
        # long, not which of the batch's lines it was: find it (only now, so a good batch is encoded once)
        number = _line_too_long(translator, cut, options)
        if number is None:
            raise
        raise ValueError(f"line {first_line + number}: {exc}") from None
    return [c.rebuild([next(translations) for _ in c.texts]) for c in cut]


def _line_too_long(translator, cut: list, options: dict) -> int | None:
    """The index of the first line with a sentence the model cannot read, or None."""
    for number, c in enumerate(cut):
        for text in c.texts:
            try:
                translator.encode_source(text, options.get("target_lang"), options.get("source_lang"))
            except ValueError:
                return number
    return None


def read_stdin() -> list[str]:
    # bytes that are not the locale's encoding (a Latin-1 file) become U+FFFD, as an editor shows them:
    # the default handlers either stop the run or pass lone surrogates on, which the tokenizer cannot encode
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="replace")
    return [line.rstrip("\n") for line in sys.stdin]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # torch starts every thread it is told to: a mistyped count (100000) crashes the process, not torch
    most_threads = 4 * (os.cpu_count() or 1)
    if args.threads > most_threads:
        fail(parser, f"--threads {args.threads}: more than {most_threads} (4 per CPU core of this machine)")
    if args.second_model and not args.pivot:
        fail(parser, f"--second-model {args.second_model}: it makes the pivot's second translation: give --pivot")
    if args.pivot and args.pivot == args.source_lang:
        fail(parser, f"--pivot {args.pivot}: the source language itself: there is nothing to pivot through")
    # every translation of the run: one, or two through --pivot (the languages as each model names them)
    routes = [(args.model, *direction(parser, args.model, args.source_lang, args.pivot or args.target_lang,
                                      ("--source-lang", "--pivot" if args.pivot else "--target-lang")))]
    if args.pivot:
        if routes[0][1] == routes[0][2]:
            fail(parser, f"--pivot {args.pivot}: the source language itself: there is nothing to pivot through")
        second = args.second_model or args.model
        routes.append((second, *direction(parser, second, args.pivot, args.target_lang, ("--pivot", "--target-lang"))))
    source_lang, target_lang = routes[0][1], routes[-1][2]
    demo = demo_sentences(parser, args.model, source_lang) if args.demo else None
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    hops = []
    for model_dir, source, target in routes:
        translator = load_translator(parser, args, model_dir) if not hops or model_dir != routes[0][0] else hops[0][0]
        hops.append((translator, dict(beam_size=args.beam_size, max_length=args.max_length, length_penalty=args.length_penalty,
                                      no_repeat_ngram_size=args.no_repeat_ngram_size, max_batch_size=args.batch_size,
                                      target_lang=target if translator.multilingual else None,
                                      source_lang=source if translator.info.language_codes else None), source))
    try:
        if demo is not None:
            with user_errors(parser, ValueError):
                for line, text in zip(demo, translate_through(hops, demo, args.split_sentences)):
                    print(f"{source_lang}: {line}\n{target_lang}: {text}")
            return 0
        translate_stdin(parser, args, hops)
    except BrokenPipeError:
        # the reader stopped early (`| head`): stop quietly, as a Unix tool does; what is still buffered
        # goes to /dev/null, or Python's flush at exit raises the same error again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def translate_through(hops: list[tuple], lines: list[str], split_sentences: bool, first_line: int = 1) -> list[str]:
    """Lines translated by each of `hops` ((translator, options, source language)) in turn: one, or two through a
    pivot language."""
    for translator, options, source_lang in hops:
        lines = translate_lines(translator, lines, split_sentences, options, source_lang, first_line)
    return lines


def translate_stdin(parser: argparse.ArgumentParser, args: argparse.Namespace, hops: list[tuple]) -> None:
    lines = read_stdin()
    show = args.progress == "always" or (args.progress == "auto" and not sys.stdin.isatty())
    # chunks of several batches: the translator sorts each chunk by length, the bar moves per chunk
    chunk = args.batch_size * 8
    # ValueError: a line the model cannot read (too long, with no place to cut it), reported after the bar
    # has closed; the chunks before its chunk are already out
    with user_errors(parser, ValueError), tqdm(total=len(lines), unit="sent", disable=not show, file=sys.stderr,
                                               dynamic_ncols=True) as bar:
        for start in range(0, len(lines), chunk):
            part = lines[start : start + chunk]
            translated = translate_through(hops, part, args.split_sentences, start + 1)
            sys.stdout.write("".join(text + "\n" for text in translated))
            sys.stdout.flush()
            bar.update(len(part))


if __name__ == "__main__":
    sys.exit(main())
