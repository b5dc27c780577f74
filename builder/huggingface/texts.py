"""The texts a Hugging Face text pipeline is verified on: read from data.validation, or generated.

Usage::

    texts = read_texts(Path("data/texts.txt"), "data.validation")   # .txt (a text per line), .jsonl, .json
    texts = generated_texts(encoder, count=48)                       # words of the tokenizer's vocabulary
    ids, mask = tokenized(encoder, texts, "data.validation")          # as the served tokenizer step makes them

The encoder is the served tokenizer step's own (templates/pipeline/text_steps.py TextEncoder), loaded
from the product's assets: the build tokenizes with the code it publishes.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from builder.core import assets
from builder.core.errors import UserInputError
from builder.core.files import module_from_file
from builder.repository.config import parse_config

TEXT_SUFFIXES = (".txt", ".jsonl", ".json")


@functools.cache  # one file, loaded once per process (encoder_for and the activation both need it)
def text_steps():
    """templates/pipeline/text_steps.py as a module (the file the steps are published with)."""
    return module_from_file(assets.pipeline_step("text_steps.py"), "triton_builder_text_steps")


def encoder_for(tokenizer_file: Path, max_length: int, truncation: bool, buckets: list[int] | None = None):
    return text_steps().TextEncoder(tokenizer_file, max_length, truncation, buckets)


def published_encoder(step: Path, version: int, name: str = "triton_builder_published_text_steps"):
    """The TextEncoder version ``version`` of the published tokenizer step ``step`` (its model folder) runs: the
    version's own text_steps.py and tokenizer.json, the folder's config parameters. validate's replay and the
    model step's payload read it as the served step does. A version published before length buckets has no
    ``step_encoder`` and pads to the longest text."""
    config = parse_config((Path(step) / "config.pbtxt").read_text())
    params = {key: value.string_value for key, value in config.parameters.items()}
    folder = Path(step) / str(version)
    steps = module_from_file(folder / "text_steps.py", name)
    if hasattr(steps, "step_encoder"):
        return steps.step_encoder(folder, params)
    return steps.TextEncoder(folder / "tokenizer.json", int(params["max_length"]), params.get("truncation") == "true")


def read_texts(path: Path, field: str) -> list[str]:
    """Texts from a .txt (one per line), .jsonl (a string or {"text": ...} per line) or .json (a list) file."""
    if path.suffix not in TEXT_SUFFIXES:
        raise UserInputError(f"{field}: {path.name} is not a text file for a Hugging Face text source; give a .txt "
                             "(one text per line), .jsonl ({\"text\": ...} per line) or .json (a list of strings)")
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{field}: {path.name} is not UTF-8 ({exc.reason} at byte {exc.start}); save it as "
                             "UTF-8") from None
    where = f"{field}: {path.name}"
    if path.suffix == ".txt":
        texts = [line.strip() for line in raw.splitlines() if line.strip()]
    elif path.suffix == ".json":
        try:
            texts = json.loads(raw)
        except ValueError as exc:
            raise UserInputError(f"{where} is not valid JSON ({exc}); give a list of strings") from None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise UserInputError(f"{where} must hold a JSON list of strings")
    else:
        texts = []
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise UserInputError(f"{where} line {number} is not JSON ({exc}); give a string or "
                                     "{\"text\": ...} per line") from None
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise UserInputError(f"{where} line {number} has no text; give a string or {{\"text\": ...}} per line")
            texts.append(text)
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UserInputError(f"{where} holds no text; give at least one")
    return texts


def generated_texts(encoder, count: int = 48, seed: int = 0) -> list[str]:
    """Sentences of whole words from the tokenizer's vocabulary, from 2 words up to a quarter of the limit."""
    vocabulary = sorted(word for word in encoder.tokenizer.get_vocab()
                        if word.isalpha() and word.isascii() and len(word) >= 3)
    if not vocabulary:
        raise UserInputError("source.huggingface: the tokenizer's vocabulary has no plain words to make texts from; "
                             "give data.validation with texts")
    rng = np.random.default_rng(seed)
    longest = max(2, min(48, encoder.max_length // 4))
    return [" ".join(rng.choice(vocabulary, size=int(n))) for n in np.linspace(2, longest, count).round()]


def tokenized(encoder, texts: list[str], field: str) -> tuple[np.ndarray, np.ndarray]:
    ids, mask, _, problems = encoder.encode(texts)
    if problems:
        listed = "; ".join(problems[row] for row in sorted(problems)[:3])
        raise UserInputError(f"{field}: {len(problems)} text(s) cannot be served: {listed}")
    return ids, mask


def bucket_inflation(lengths: list[int], buckets: list[int]) -> float:
    """The compute ``buckets`` add to texts of ``lengths`` tokens: padded tokens / real tokens."""
    return sum(text_steps().padded_length(buckets, n) for n in lengths) / max(1, sum(lengths))


BUCKET_MARGIN = 1.05  # batching must beat the padding it costs by this much: below it, run-to-run noise decides


def bucket_decision(lengths: list[int], buckets: list[int],
                    throughput_by_batch: dict | None) -> tuple[list[int], str]:
    """Whether the tokenizer step pads to ``buckets`` (so the model step's batcher can merge texts of different
    lengths) or to each call's longest text (the least padding), from this host's measurement of the model:
    its best samples/s over batch sizes against batch 1 (``throughput_by_batch``, the build's benchmark) must
    beat the compute the buckets add to the validation texts (padded tokens / real tokens) by ``BUCKET_MARGIN``.
    Unmeasured (no benchmark), the buckets stay: batching is what an unmeasured server is sized for."""
    if not buckets or not lengths:
        return [], "no length buckets (no texts to choose them from)"
    inflation = bucket_inflation(lengths, buckets)
    rates = {int(b): float(v) for b, v in (throughput_by_batch or {}).items() if v}
    if 1 not in rates or len(rates) < 2:
        return buckets, (f"length buckets {buckets}: they pad the validation texts to {inflation:.2f}x their tokens; "
                         "kept unmeasured (no benchmark of the model by batch size)")
    best = max(rates, key=rates.get)
    gain = rates[best] / rates[1]
    figures = (f"batch {best} runs {gain:.2f}x the samples/s of batch 1 here, the buckets pad the validation texts "
               f"to {inflation:.2f}x their tokens")
    if gain > inflation * BUCKET_MARGIN:
        return buckets, f"length buckets {buckets}: {figures}, so texts of different lengths batch"
    return [], (f"no length buckets: {figures}, so each call pads to its longest text (batching does not pay "
                "the padding on this host)")
