"""Translate a test set and score it with sacreBLEU (cased, 13a tokenizer, detokenized output).

    python -m nmt_serve.training.evaluate --model checkpoints/de-en \
        --src ../shared/data/multi30k/test_2016_flickr.de.gz --ref ../shared/data/multi30k/test_2016_flickr.en.gz

Prints BLEU and chrF with their sacreBLEU signatures, and how many outputs run away (longer than 3x
their source in tokens). --json prints one JSON object instead. A multilingual model needs
--target-lang, and one of the NLLB-200, M2M100 and mBART-50 families (nmt-convert) --source-lang too;
--pivot en translates into English first and from there into the target (with the same
model, or --second-model), the baseline a direct multilingual direction should beat.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from nmt_serve.cli.common import (
    add_load_options,
    check_files,
    check_model,
    fail,
    load_translator,
    positive_int,
    require_eval_extra,
    user_errors,
)
from nmt_serve.inference.translator import Translator
from nmt_serve.network.checkpoint import CheckpointInfo
from nmt_serve.text.language_codes import iso_aliases
from nmt_serve.training.data import read_lines


def evaluate(translator: Translator, sources: list[str], references: list[str], *, beam_size: int, batch_size: int = 64,
             target_lang: str | None = None, pivot: str | None = None, second: Translator | None = None,
             source_lang: str | None = None) -> dict:
    """Scores of translator's output; with pivot, of the pivot-language output translated on into
    target_lang (by `second`, default the same model). source_lang: the sources' language, which a
    fairseq-family model needs (other models ignore it)."""
    t0 = time.time()
    if pivot:
        first = translator.translate(sources, beam_size=beam_size, max_batch_size=batch_size, target_lang=pivot,
                                     source_lang=source_lang)
        translator = second or translator
        results = translator.translate([r.text for r in first], beam_size=beam_size, max_batch_size=batch_size,
                                       target_lang=target_lang, source_lang=pivot)
    else:
        results = translator.translate(sources, beam_size=beam_size, max_batch_size=batch_size, target_lang=target_lang,
                                       source_lang=source_lang)
    seconds = time.time() - t0
    hypotheses = [r.text for r in results]
    import sacrebleu  # the eval extra: main() checks it is there

    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    runaway = sum(
        1 for s, r in zip(sources, results)
        if len(r.hypotheses[0].tokens) > 3 * max(translator.inputs.count(s), 1)
    )
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "beam_size": beam_size,
        **({"pivot": pivot} if pivot else {}),
        "sentences": len(sources),
        "runaway_outputs": runaway,
        "seconds": round(seconds, 1),
        "hypotheses": hypotheses,
    }


def served(info: CheckpointInfo) -> str:
    """What a model serves, in a line: a many-to-many model (NLLB-200's 40000 directions) by its languages."""
    if info.language_codes:
        return f"its languages are {', '.join(info.language_codes)}"
    return f"it serves {', '.join(info.served())}"


def model_code(info: CheckpointInfo, language: str | None) -> str | None:
    """The model's own code of a language, which may be named by ISO 639-1 too (de for NLLB's deu_Latn)."""
    if language and info.language_codes:
        return iso_aliases(info.language_codes).get(language, language)
    return language


def serves(info: CheckpointInfo, source: str | None, target: str | None) -> bool:
    """Whether the model translates source into target, a language left None being any."""
    return any((source is None or s == source) and (target is None or t == target)
               for s, _, t in (d.partition("-") for d in info.served()))


def route_problem(first: CheckpointInfo, second: CheckpointInfo, source: str | None, target: str | None,
                  pivot: str | None) -> str | None:
    """Why `first` cannot translate source into target, or with a pivot, `first` source into pivot and
    `second` pivot into target (one line), or None. A language left out is any the model serves."""
    if not pivot:
        if serves(first, model_code(first, source), model_code(first, target)):
            return None
        route = f"{source}->{target}" if source and target else f"from {source}" if source else f"into {target}"
        return f"--model does not translate {route}; {served(first)}"
    # a language left out is the model's own where it has one direction
    if source is None and len(first.served()) == 1:
        source = first.served()[0].partition("-")[0]
    if target is None and len(second.served()) == 1:
        target = second.served()[0].partition("-")[2]
    if model_code(first, pivot) == model_code(first, source):
        return f"--pivot {pivot}: the source language itself: there is nothing to pivot through"
    if model_code(second, pivot) == model_code(second, target):
        return f"--pivot {pivot}: the target language itself: there is nothing to pivot through"
    if not serves(first, model_code(first, source), model_code(first, pivot)):
        return f"--pivot {pivot}: --model does not translate {source or 'the source'} into {pivot} ({served(first)})"
    if not serves(second, model_code(second, pivot), model_code(second, target)):
        model = "--second-model" if second is not first else "--model (give --second-model for the second hop)"
        return f"--pivot {pivot}: {model} does not translate {pivot} into {target or 'the target'} ({served(second)})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nmt-evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser)
    require_eval_extra(parser)
    parser.add_argument("--src", required=True, help="source file (plain or .gz)")
    parser.add_argument("--ref", required=True, help="reference file (plain or .gz)")
    parser.add_argument("--beam-size", type=positive_int, default=4)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--source-lang", help="the test set's language (a converted NLLB-200, M2M100 or mBART-50 model needs it)")
    parser.add_argument("--target-lang", help="the language to translate into (a multilingual model needs it)")
    parser.add_argument("--pivot", help="translate into this language first, then from it into --target-lang")
    parser.add_argument("--second-model", help="the model of the pivot's second hop (default: --model)")
    parser.add_argument("--output", help="also write the translations here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # every input checked before the model loads and the test set is translated, the slow parts
    info = check_model(parser, args.model)
    check_files(parser, {"--src": args.src, "--ref": args.ref})
    texts = []
    for flag, path in (("--src", args.src), ("--ref", args.ref)):
        with user_errors(parser, OSError, UnicodeDecodeError, EOFError, about=f"{flag} {path}"):  # a corrupt .gz, not UTF-8
            texts.append(read_lines(path))
    sources, references = texts
    if len(sources) != len(references):
        fail(parser, f"{args.src} has {len(sources)} lines, {args.ref} has {len(references)}")
    if not sources:  # sacreBLEU has no score for no sentences (it raises IndexError)
        fail(parser, f"{args.src} and {args.ref} are empty: no sentences to score")
    if args.output:
        with user_errors(parser, OSError):
            open(args.output, "w").close()
    if args.second_model and not args.pivot:
        fail(parser, f"--second-model {args.second_model}: it translates the pivot's second hop: give --pivot")
    second_info = check_model(parser, args.second_model) if args.second_model else info
    if problem := route_problem(info, second_info, args.source_lang, args.target_lang, args.pivot):
        fail(parser, problem)
    translator = load_translator(parser, args)
    second = None
    if args.second_model:
        with user_errors(parser, ValueError, RuntimeError, about=f"--second-model {args.second_model}"):
            second = Translator.load(args.second_model, device=translator.device, dtype=translator.dtype)
    with user_errors(parser, ValueError):  # a source or target language the model does not serve
        report = evaluate(translator, sources, references, beam_size=args.beam_size, batch_size=args.batch_size,
                          target_lang=args.target_lang, pivot=args.pivot, second=second, source_lang=args.source_lang)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in report["hypotheses"])
    del report["hypotheses"]
    if args.json:
        print(json.dumps(report))
    else:
        print(f"BLEU {report['bleu']:.2f}  {report['bleu_signature']}")
        print(f"chrF {report['chrf']:.2f}  {report['chrf_signature']}")
        print(f"{report['sentences']} sentences, beam {report['beam_size']}, {report['seconds']}s, runaway outputs: {report['runaway_outputs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
