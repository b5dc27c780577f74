"""Model-zoo conformance: build, verify, publish, serve and check a broad set of architectures, one table.

Each model is made from a transformers config, offline, with random weights (no downloads, no
torchvision), or - for the families no config gives (LSTM/GRU taggers, loops over a dynamic length or
a data-dependent count, a detector with variable-size outputs, a segmenter) - from plain torch modules
in benchmarks/zoo_models.py; written out as a spec folder the way a user would, then built with
``triton-builder build`` (the library's ``build``), served on the embedded tritonserver and checked
over HTTP and gRPC (``check``). Prints one row per model: build seconds, the exporter that produced
the ONNX variant, variants verified, the published variant, the served rel L2 (worst output over
both protocols and every reference case) and the published variant's measured speed-up over FP32
onnx (in-process, the build's own benchmark: --benchmark-seconds per variant), or the refusal with
its reason.

Usage: python benchmarks/model_zoo.py [--models resnet,bert,...] [--variants onnx,torchscript,...]
                                      [--benchmark-seconds 1] [--keep DIR]
Not part of the test run (tests/integration/test_model_zoo.py builds a fast subset, marker slow).
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IMAGE = {"inputs": [{"name": "pixel_values", "dtype": "float32", "shape": [3, 32, 32]}],
         "outputs": [{"name": "logits"}], "max_batch_size": 4}
TEXT = {"inputs": [{"name": "input_ids", "dtype": "int64", "shape": [-1], "min_shape": [4], "opt_shape": [8],
                    "max_shape": [16]}],
        "outputs": [{"name": "logits"}], "max_batch_size": 4}

_WRAP = '''
import torch
import transformers


class Wrapped(torch.nn.Module):
    """Called with keyword arguments, returns the logits tensor only (what Triton serves)."""

    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        return self.model(**{{self.key: x}}).logits


def build():
    torch.manual_seed(0)
    config = transformers.{config}({args})
    return Wrapped(transformers.{cls}(config).eval(), "{key}")
'''

AUDIO = {"inputs": [{"name": "input_values", "dtype": "float32", "shape": [-1], "min_shape": [1600],
                     "opt_shape": [8000], "max_shape": [16000]}],  # 0.1 to 1 s of 16 kHz audio
         "outputs": [{"name": "logits"}], "max_batch_size": 4}
SEGMENT = {"inputs": [{"name": "pixel_values", "dtype": "float32", "shape": [3, -1, -1], "min_shape": [3, 32, 32],
                       "opt_shape": [3, 64, 64], "max_shape": [3, 128, 128]}],
           "outputs": [{"name": "logits"}], "max_batch_size": 2}
TAGS = {"inputs": [{"name": "input_ids", "dtype": "int64", "shape": [-1], "min_shape": [4], "opt_shape": [32],
                    "max_shape": [128], "value_range": [0, 5000]}],
        "outputs": [{"name": "logits"}], "max_batch_size": 8}

# name: (config class, model class, config kwargs, input key, spec)
ZOO = {
    "resnet": ("ResNetConfig", "ResNetForImageClassification",
               "embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type='basic', num_labels=10",
               "pixel_values", IMAGE),
    "mobilenet_v2": ("MobileNetV2Config", "MobileNetV2ForImageClassification",
                     "depth_multiplier=0.35, image_size=32, num_labels=10", "pixel_values", IMAGE),
    "vit": ("ViTConfig", "ViTForImageClassification",
            "image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, "
            "intermediate_size=64, num_labels=10", "pixel_values", IMAGE),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification",
                 "num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10", "pixel_values", IMAGE),
    "swin": ("SwinConfig", "SwinForImageClassification",
             "image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, "
             "num_labels=10", "pixel_values", IMAGE),
    "efficientnet": ("EfficientNetConfig", "EfficientNetForImageClassification",
                     "image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=10",
                     "pixel_values", IMAGE),
    "regnet": ("RegNetConfig", "RegNetForImageClassification",
               "embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, num_labels=10",
               "pixel_values", IMAGE),
    "bert": ("BertConfig", "BertForSequenceClassification",
             "vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, "
             "max_position_embeddings=32, num_labels=3", "input_ids", TEXT),
    "distilbert": ("DistilBertConfig", "DistilBertForSequenceClassification",
                   "vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32, "
                   "num_labels=3", "input_ids", TEXT),
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification",
                "vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, "
                "max_position_embeddings=40, num_labels=3", "input_ids", TEXT),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             "vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32", "input_ids", TEXT),
    "electra": ("ElectraConfig", "ElectraForSequenceClassification",
                "vocab_size=1000, embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, "
                "intermediate_size=128, max_position_embeddings=64, num_labels=3", "input_ids", TEXT),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2ForCTC",
                 "vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, "
                 "conv_dim=(32, 32, 32), conv_stride=(5, 4, 4), conv_kernel=(10, 8, 4), num_conv_pos_embeddings=16, "
                 "num_conv_pos_embedding_groups=4", "input_values", AUDIO),
    "segformer": ("SegformerConfig", "SegformerForSemanticSegmentation",
                  "num_encoder_blocks=2, depths=[1, 1], sr_ratios=[4, 2], hidden_sizes=[16, 32], "
                  "num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], "
                  "decoder_hidden_size=32, num_labels=5", "pixel_values", SEGMENT),
}

# plain torch modules from benchmarks/zoo_models.py (copied into the spec folder): name -> spec
CUSTOM = {
    "lstm_tagger": TAGS,
    "gru_tagger": TAGS,
    "rnn_loop": {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 16], "min_shape": [4, 16],
                             "opt_shape": [12, 16], "max_shape": [32, 16]}],
                 "outputs": [{"name": "scores"}], "max_batch_size": 8},
    "refine_loop": {"inputs": [{"name": "x", "dtype": "float32", "shape": [16]}],
                    "outputs": [{"name": "logits"}, {"name": "steps"}], "max_batch_size": 8},
    "detector": {"inputs": [{"name": "image", "dtype": "float32", "shape": [3, -1, -1], "min_shape": [3, 64, 64],
                             "opt_shape": [3, 128, 128], "max_shape": [3, 256, 256]}],
                 "outputs": [{"name": "boxes"}, {"name": "scores"}, {"name": "labels"}], "max_batch_size": 0},
    "detector_batched": {"inputs": [{"name": "image", "dtype": "float32", "shape": [3, 128, 128]}],
                         "outputs": [{"name": "boxes"}, {"name": "scores"}, {"name": "labels"}], "max_batch_size": 4},
    "segmenter": {"inputs": [{"name": "image", "dtype": "float32", "shape": [3, -1, -1], "min_shape": [3, 32, 32],
                              "opt_shape": [3, 96, 96], "max_shape": [3, 160, 160]}],
                  "outputs": [{"name": "logits"}], "max_batch_size": 4},
}
MODELS = [*ZOO, *CUSTOM]
# refused on purpose, with the reason in the README table: the run still succeeds when only these refuse
EXPECTED_REFUSALS = {"efficientnet": "the output does not depend on the inputs",
                     "detector_batched": "field 'max_batch_size'"}


def write_spec(root: Path, name: str, variants: list[str], **changes) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if name in CUSTOM:
        shutil.copyfile(Path(__file__).resolve().parent / "zoo_models.py", folder / "zoo_models.py")
        source, spec = f"zoo_models:build_{name}", CUSTOM[name]
    else:
        config, cls, args, key, spec = ZOO[name]
        (folder / "zoo_model.py").write_text(_WRAP.format(config=config, cls=cls, args=args, key=key).lstrip())
        source = "zoo_model:build"
    data = {"name": f"zoo_{name}", "source": {"module": source}, "variants": variants, **spec, **changes}
    (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "spec.yaml"


def run_zoo(names: list[str], root: Path, variants: list[str], benchmark_seconds: float = 0.0) -> list[dict]:
    """Build every model into root/model_repository, serve them, check each; one record per model.
    With ``benchmark_seconds`` > 0 the build measures its variants (that cap each) and selects by
    throughput; the row's ``speedup`` is the published variant's best throughput over FP32 onnx's."""
    from builder.core.errors import BuilderError
    from builder.pipeline import build
    from builder.serving.check import check_served
    from builder.serving.embedded import EmbeddedServer

    repo = root / "model_repository"
    rows = []
    for name in names:
        row = {"model": name, "build_s": None, "exporter": "-", "verified": "-", "published": "-",
               "served_rel_l2": None, "speedup": None, "refusal": "", "note": ""}
        start = time.perf_counter()
        try:
            result = build(write_spec(root, name, variants), repo, benchmark_seconds=benchmark_seconds,
                           progress=lambda _: None)
            row["build_s"] = time.perf_counter() - start
            ctx = result.context
            row["exporter"] = next((v.exporter for v in ctx.variants if v.format == "onnx"), "-") or "-"
            row["verified"] = ",".join(v.name for v in ctx.variants if v.verified) or "-"
            row["published"] = next((v.name for v in ctx.variants if v.selected), "-")
            row["speedup"] = _speedup(ctx)
            notes = ["trace-unsafe: scripted" for n in ctx.notes if n.startswith("trace-unsafe")][:1]
            notes += [f"{v.name} not verified: {v.rejected.splitlines()[1].lstrip('- ')[:90]}"
                      for v in ctx.variants if v.verified is False and "\n" in v.rejected]
            notes += [n for v in ctx.variants if v.format == "onnx" for n in v.notes
                      if not n.startswith("if verification fails")]
            row["note"] = re.sub(r"\x1b\[[0-9;]*m", "", "; ".join(" ".join(n.split()) for n in notes))[:300]
        except Exception as exc:  # noqa: BLE001 - a refusal (BuilderError) or a bug: either is a row, not a stop
            row["build_s"] = time.perf_counter() - start
            kind = "" if isinstance(exc, BuilderError) else f"{type(exc).__name__} (not a BuilderError): "
            row["refusal"] = kind + " ".join(str(exc).split())[:300]
        rows.append(row)
    built = [r for r in rows if not r["refusal"]]
    if built:
        server = EmbeddedServer(repo, ready_timeout=120)
        server.start()
        try:
            for row in built:
                try:
                    report = check_served(f"zoo_{row['model']}", repository=repo, url=server.http_url,
                                          grpc_url=server.grpc_url, protocol="both")
                except BuilderError as exc:
                    row["refusal"] = "check: " + " ".join(str(exc).split())[:300]
                    continue
                row["served_rel_l2"] = max((m.get("rel_l2", float("inf")) for per in report.metrics.values()
                                            for m in per.values()), default=None)
                if not report.ok:
                    row["refusal"] = "check failed: " + "; ".join(report.failures)[:300]
        finally:
            server.stop()
    return rows


def _speedup(ctx) -> float | None:
    """The published variant's best measured throughput over FP32 onnx's (None: not both measured)."""
    chosen, plain = next((v for v in ctx.variants if v.selected), None), ctx.variant("onnx")
    fast = (chosen.benchmark or {}).get("best_throughput") if chosen else None
    base = (plain.benchmark or {}).get("best_throughput") if plain else None
    return fast / base if fast and base else None


def table(rows: list[dict]) -> str:
    head = ["model", "build s", "exporter", "variants verified", "published", "served rel L2", "x FP32 onnx",
            "refusal / reason (or exporter note)"]
    body = [[r["model"], f"{r['build_s']:.1f}" if r["build_s"] is not None else "-", r["exporter"], r["verified"],
             r["published"], f"{r['served_rel_l2']:.1e}" if r["served_rel_l2"] is not None else "-",
             f"{r['speedup']:.2f}" if r.get("speedup") else "-", r["refusal"] or r["note"] or "-"] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def host_line() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    flags = sorted(set(re.findall(r"\b(avx512_vnni|avx512f|avx2)\b", Path("/proc/cpuinfo").read_text())))
    import torch
    import transformers
    return (f"{date.today()} | {cpu} | ISA {' '.join(flags) or 'none of avx2/avx512f/avx512_vnni'} | "
            f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--variants", default="onnx,torchscript,onnx_opt,onnx_int8_dynamic",
                        help="variants each model tries (default: %(default)s)")
    parser.add_argument("--benchmark-seconds", type=float, default=1.0,
                        help="measuring cap per variant; 0 skips measuring (no speed-up column) (default: %(default)s)")
    parser.add_argument("--keep", help="build into this folder (kept) instead of a temporary one")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    with tempfile.TemporaryDirectory(prefix="model-zoo-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        rows = run_zoo(names, root, args.variants.split(","), args.benchmark_seconds)
    print(host_line())
    print(table(rows))
    unexpected = [r["model"] for r in rows if r["refusal"] and EXPECTED_REFUSALS.get(r["model"], "\0") not in r["refusal"]]
    return 1 if unexpected else 0


if __name__ == "__main__":
    raise SystemExit(main())
