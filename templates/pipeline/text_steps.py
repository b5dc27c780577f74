"""Text pre- and post-processing of a Hugging Face pipeline, written by triton-builder.

Plain Python (numpy and the `tokenizers` library; no Triton import): the python steps beside this file
(preprocess.py, postprocess.py) serve it, and the build runs the very same file on the validation texts,
so the ids the model was verified on are the ids it is served.

Usage::

    encoder = TextEncoder("tokenizer.json", max_length=128, truncation=False, buckets=[8, 16, 32, 64, 128])
    encoder = step_encoder(version_folder, {"max_length": "128", "length_buckets": "8,16,32,64,128"})
    encoded = encoder.encode([b"a text", "another"])   # ids, mask, offsets padded to the bucket of the longest
    length_buckets([5, 12, 40], max_length=128)         # [8, 16, 32, 64, 128]: powers of two from the shortest
    labels, best, scores = classify(logits, ["NEG", "POS"], "softmax")
    entities = token_entities(text, logits, ids, offsets, ["O", "NUM"], tokenizer)   # a text's tagged tokens
"""

import json
from collections import namedtuple

import numpy as np

#: int64 [rows, longest] ids and mask; int64 [rows, longest, 2] character offsets; {row: why it cannot be served}
Encoded = namedtuple("Encoded", "ids mask offsets problems")


def length_buckets(lengths, max_length, smallest=8):
    """The sequence lengths a text step pads to: powers of two from the one that holds the shortest of ``lengths``
    (at least ``smallest``) up to the model's limit, which closes the list. Requests whose texts fall in one bucket
    reach the model with one shape, so Triton's dynamic batcher can merge them (it batches equal shapes only);
    padding to at most twice a text's length keeps the wasted compute bounded."""
    limit = int(max_length)
    if limit <= 0:
        return []
    start = max(int(smallest), min(lengths) if lengths else 1)
    bucket = 1
    while bucket < start:
        bucket *= 2
    out = []
    while bucket < limit:
        out.append(bucket)
        bucket *= 2
    return out + [limit]


def padded_length(buckets, longest):
    """The bucket a batch whose longest text has ``longest`` tokens is padded to (no bucket holds it: ``longest``)."""
    return next((b for b in sorted(buckets) if b >= longest), longest)


def step_encoder(folder, params):
    """The TextEncoder a published tokenizer step runs: its version folder's tokenizer.json and its config's
    parameters (string values: max_length, truncation, length_buckets) - the step, validate's replay and the
    payload sweep and tune send a pipeline's model step all read it the same way."""
    import os

    buckets = [int(b) for b in params.get("length_buckets", "").split(",") if b.strip()]
    return TextEncoder(os.path.join(folder, "tokenizer.json"), int(params["max_length"]),
                       params.get("truncation", "false") == "true", buckets)


class TextEncoder:
    def __init__(self, tokenizer_file, max_length, truncation, buckets=None):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()
        self.max_length = int(max_length)
        self.truncation = bool(truncation)
        if self.truncation:
            self.tokenizer.enable_truncation(self.max_length)
        else:
            self.tokenizer.no_truncation()
        with open(tokenizer_file, encoding="utf-8") as handle:
            padding = (json.load(handle).get("padding") or {})
        pad_token = padding.get("pad_token", "[PAD]")
        found = self.tokenizer.token_to_id(pad_token)
        self.pad_id = int(padding.get("pad_id", found if found is not None else 0))
        self.buckets = sorted(int(b) for b in buckets or [])


    @staticmethod
    def text_of(value, row):
        """A request's text as str; (None, why) where it is not one a model can take."""
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                return None, f"text {row} is not valid UTF-8 ({exc.reason} at byte {exc.start}); send UTF-8 text"
        if not isinstance(value, str):
            return None, f"text {row} is {type(value).__name__}, not a string; send the text as TYPE_STRING (BYTES)"
        if not value.strip():
            return None, f"text {row} is empty; send the text to process"
        return value, None

    @property
    def unknown_id(self):
        return unknown_token_id(self.tokenizer)

    def statistics(self, encoded, rows=None):
        """(texts, tokens, unknown tokens) of the servable rows: what the text drift counters add."""
        keep = [r for r in (range(len(encoded.ids)) if rows is None else rows) if r not in encoded.problems]
        if not keep:
            return 0, 0, 0
        mask = encoded.mask[keep].astype(bool)
        unknown = int(((encoded.ids[keep] == self.unknown_id) & mask).sum()) if self.unknown_id is not None else 0
        return len(keep), int(mask.sum()), unknown

    def encode(self, values):
        """Encoded ids, mask and offsets padded with the pad id to the longest text, or to the bucket that holds
        it; problems maps a row that cannot be served to why (its row is left padding)."""
        texts, problems = [], {}
        for row, value in enumerate(values):
            text, why = self.text_of(value, row)
            if why:
                problems[row] = why
            texts.append(text or "")
        encodings = self.tokenizer.encode_batch(texts)
        for row, encoding in enumerate(encodings):
            if row not in problems and len(encoding.ids) > self.max_length:
                problems[row] = (f"text {row} is {len(encoding.ids)} tokens, over the model's limit of "
                                 f"{self.max_length}; shorten it, or build with source.truncation: true to cut it")
        longest = padded_length(self.buckets,
                                max([len(e.ids) for r, e in enumerate(encodings) if r not in problems] or [1]))
        ids = np.full((len(texts), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(texts), longest), dtype=np.int64)
        offsets = np.zeros((len(texts), longest, 2), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            if row in problems:
                ids[row, 0], mask[row, 0] = self.pad_id, 1
                continue
            n = len(encoding.ids)
            ids[row, :n] = encoding.ids
            mask[row, :n] = encoding.attention_mask
            offsets[row, :n] = encoding.offsets
        return Encoded(ids, mask, offsets, problems)


def activation(config):
    """transformers' text-classification pipeline's choice: sigmoid for one label or multi-label, else softmax."""
    if config.get("problem_type") == "multi_label_classification" or int(config.get("num_labels", 2)) == 1:
        return "sigmoid"
    return "softmax"


def classify(logits, labels, function):
    """(label per row as bytes, its score, every label's score) from logits [rows, labels]."""
    logits = np.asarray(logits, dtype=np.float64)
    if function == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = shifted / shifted.sum(axis=-1, keepdims=True)
    best = scores.argmax(axis=-1)
    names = np.array([labels[i].encode("utf-8") for i in best], dtype=np.object_)
    return names, scores[np.arange(len(best)), best].astype(np.float32), scores.astype(np.float32)


def unknown_token_id(tokenizer):
    """The id of the tokenizer's unknown token ([UNK]), or None for a tokenizer without one (byte-level BPE)."""
    unk_token = getattr(tokenizer.model, "unk_token", None)
    return tokenizer.token_to_id(unk_token) if unk_token else None


def special_token_ids(tokenizer_file):
    """The ids of the tokenizer's special tokens ([CLS], [SEP], [PAD], ...): never tagged."""
    with open(tokenizer_file, encoding="utf-8") as handle:
        added = json.load(handle).get("added_tokens") or []
    return {int(t["id"]) for t in added if t.get("special")}


def token_entities(text, logits, ids, offsets, labels, tokenizer, special_ids, ignore=("O",)):
    """transformers' token-classification pipeline (aggregation none) on one text: a dict per token whose
    label is not ignored - entity, score, index, word (the token; the text's own characters for an unknown
    one), start, end (character offsets into the text)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    scores = shifted / shifted.sum(axis=-1, keepdims=True)
    unknown = unknown_token_id(tokenizer)
    entities = []
    for index, token in enumerate(int(i) for i in ids):
        if token in special_ids:
            continue
        best = int(scores[index].argmax())
        if labels[best] in ignore:
            continue
        start, end = int(offsets[index][0]), int(offsets[index][1])
        word = text[start:end] if token == unknown else tokenizer.id_to_token(token)
        entities.append({"entity": labels[best], "score": float(scores[index, best]), "index": index, "word": word,
                         "start": start, "end": end})
    return entities
