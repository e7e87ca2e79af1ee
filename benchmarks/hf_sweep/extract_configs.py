"""Record a tiny config and example-input specs for every model type transformers registers.

    python -m benchmarks.hf_sweep.extract_configs /path/to/transformers-checkout [--out configs.json]
    python -m benchmarks.hf_sweep.extract_configs --generic-only --only TYPE ...

The checkout is a transformers source tree (its tests/ and utils/ folders). transformers' test suite
builds a tiny config and inputs per architecture in its `*Tester` classes; this script imports each
test module, instantiates every tester with a stub parent and records what it produced, as data: the
config (`config.to_dict()`), each input as a spec (name, shape, dtype, kind, range; small integer
inputs with their values, since token ids such as image placeholders must sit where the tester put
them), and the model classes its test class lists. Nothing of the tests' code is kept.

Model types without a tester that runs on the installed transformers get a generic config: the
default config with its sizes shrunk (GENERIC_SIZES, applied to every nested sub-config, and STAGE_SIZES for the
few whose per-stage lists keep them large) and inputs
guessed from the main input name of the model they run (the auto-mapped base model, else the first of
the classes transformers exports for that config). Such entries say `"source": "generic"`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.machinery
import inspect
import io
import json
import os
import re
import sys
import types
import unittest
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs.json"

# Fields a generic config shrinks to, wherever a (sub-)config has them.
GENERIC_SIZES = {
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "num_decoder_layers": 2, "depth": 2,
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "dim": 32, "embed_dim": 32,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "num_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "d_ff": 64, "n_inner": 64,
    "head_dim": 8, "vocab_size": 1000, "max_position_embeddings": 128, "n_positions": 128,
    "image_size": 32, "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_intermediate_size": 32,
    # multi-head latent attention (DeepSeek V3's): its head parts and low ranks, head_dim being the rotary part
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "kv_lora_rank": 16, "q_lora_rank": 16,
    "index_n_heads": 4, "index_head_dim": 16,  # DeepSeek V3.2's indexer
}
ROUTING_SIZES = {"num_experts_per_tok": 2, "num_experts_per_token": 2, "n_group": 2}  # capped where the experts were shrunk (4 left)
# Per-stage lists GENERIC_SIZES cannot shrink, since their lengths are tied to each other, by (sub-)config type.
# Without them a default config stays large however small its widths: VibeVoice's acoustic tokenizers double their
# channels over seven stages, which left its generic model at 1.03 B params (the forward on text reads 83 K).
STAGE_SIZES = {
    "vibevoice_acoustic_tokenizer": {"downsampling_ratios": [2], "depths": [1, 1], "kernel_size": 3},
    "vibevoice_acoustic_tokenizer_encoder": {"downsampling_ratios": [2], "depths": [1, 1], "kernel_size": 3},
}
INT_VALUES_MAX = 10_000  # integer/bool inputs up to this many elements are recorded with their values


class _Parent(unittest.TestCase):
    """The stub a tester is built with: testers call only unittest's assert methods on it."""

    def runTest(self) -> None:  # noqa: N802 - unittest's name
        pass


def _tolerant_import(name: str, tries: int = 30) -> types.ModuleType:
    """Import a test module written for another transformers version: a name it imports that the
    installed transformers lacks is stubbed (testers only need configs and tensor helpers)."""
    for _ in range(tries):
        try:
            return importlib.import_module(name)
        except ImportError as err:
            missing = re.match(r"cannot import name '(\w+)' from '([\w.]+)'", str(err))
            if missing:
                owner = importlib.import_module(missing.group(2))
                setattr(owner, missing.group(1), _stub(missing.group(1)))
            elif err.name and err.name not in sys.modules and not err.name.startswith(("tests", "transformers")) \
                    and "Could not import module" not in str(err):
                sys.modules[err.name] = _stub_module(err.name)
            else:
                raise
            for mod in [m for m in sys.modules if m == name]:
                del sys.modules[mod]
    raise ImportError(f"{name}: too many missing names")


def _lenient_lazy_modules(root: Path) -> None:
    """transformers' lazy modules answer a test module's import of a name the installed version lacks
    with a stub, not an error (transformers' own lookups keep their errors)."""
    from transformers.utils import import_utils

    strict = import_utils._LazyModule.__getattr__
    tests = str(root / "tests")

    def lenient(self: Any, name: str) -> Any:
        try:
            return strict(self, name)
        except (ImportError, AttributeError):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            if name.startswith("__") or frame is None or not frame.f_code.co_filename.startswith(tests):
                raise
            return _stub(name)

    import_utils._LazyModule.__getattr__ = lenient


def _stub(name: str) -> Any:
    return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def attribute(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stub(attr)

    module.__getattr__ = attribute  # type: ignore[method-assign]
    return module


def input_spec(name: str, value: Any) -> dict[str, Any]:
    """One input as data: a tensor's shape, dtype and value kind; a plain value as itself."""
    import torch

    if isinstance(value, torch.Tensor):
        spec: dict[str, Any] = {"name": name, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        if value.numel() == 0:
            spec["kind"] = "empty"
        elif value.dtype == torch.bool or not value.is_floating_point():
            v = value.to(torch.int64)
            low, high = int(v.min()), int(v.max())
            spec.update(kind="ones" if low == high == 1 else "int", low=low, high=high + 1)
            if value.numel() <= INT_VALUES_MAX and spec["kind"] != "ones":
                spec["values"] = v.flatten().tolist()
        else:
            v = value.detach().to(torch.float64)
            lo, hi = float(v.min()), float(v.max())
            spec.update(kind="uniform" if lo >= 0.0 and hi <= 1.0 else "randn", min=lo, max=hi)
        return spec
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"name": name, "kind": "value", "value": value}
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value):
        return {"name": name, "kind": "value", "value": list(value)}
    return {"name": name, "kind": "unsupported", "type": type(value).__name__}


def _config_dict(config: Any) -> dict[str, Any]:
    return json.loads(json.dumps(config.to_dict(), default=str))


def from_tester(tester_cls: type) -> tuple[Any, dict[str, Any]]:
    """The tester's config and common inputs dict."""
    tester = tester_cls(_Parent())
    if hasattr(tester, "prepare_config_and_inputs_for_common"):
        config, inputs = tester.prepare_config_and_inputs_for_common()
    else:
        out = tester.prepare_config_and_inputs()
        config, inputs = out[0], out[1] if len(out) == 2 and isinstance(out[1], dict) else None
    if not isinstance(inputs, dict):
        raise TypeError("the tester's inputs are not a dict")
    return config, inputs


def _test_classes(module: types.ModuleType) -> list[tuple[str, ...]]:
    found = []
    for obj in vars(module).values():
        try:
            classes = getattr(obj, "all_model_classes", None) if isinstance(obj, type) else None
        except Exception:  # a class attribute that needs a library the machine lacks
            continue
        if isinstance(classes, (tuple, list)) and classes:
            found.append(tuple(classes))
    return found


def scan_tests(root: Path, model_types: list[str]) -> dict[str, dict[str, Any]]:
    """Every tester in tests/models, keyed by the model type of the config it builds (first one wins,
    the directory named after the model type first)."""
    import torch
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    sys.path[:0] = [str(root), str(root / "utils")]
    _lenient_lazy_modules(root)
    # the pipeline mixin reads a transformers source tree (src/); testers never need it
    sys.modules["tests.test_pipeline_mixin"] = _stub_module("tests.test_pipeline_mixin")
    found: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    dirs = sorted({model_type_to_module_name(t) for t in model_types})
    for folder in dirs:
        for path in sorted((root / "tests" / "models" / folder).glob("test_modeling_*.py")):
            if "_tf_" in path.name or "_flax_" in path.name:
                continue
            module_name = f"tests.models.{folder}.{path.stem}"
            try:
                with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    module = _tolerant_import(module_name)
            except Exception as err:  # a tester for another transformers version
                failures[folder] = f"import: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
                continue
            tests = _test_classes(module)
            for name, obj in sorted(vars(module).items(), key=lambda kv: not kv[0].endswith("ModelTester")):
                if not (isinstance(obj, type) and name.endswith("Tester") and obj.__module__ == module.__name__):
                    continue
                try:
                    torch.manual_seed(0)
                    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        config, inputs = from_tester(obj)
                    model_type = config.model_type
                    if model_type in found:
                        continue
                    classes = sorted({c.__name__ for group in tests for c in group
                                      if getattr(c, "config_class", None) is type(config)})
                    found[model_type] = {
                        "model_type": model_type, "source": "tester", "tester": f"{module_name}.{name}",
                        "config": _config_dict(config),
                        "inputs": [input_spec(k, v) for k, v in inputs.items()],
                        "model_classes": classes,
                    }
                except Exception as err:
                    failures.setdefault(folder, f"{name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200])
    for model_type in model_types:
        folder = model_type_to_module_name(model_type)
        if model_type not in found and folder in failures:
            found.setdefault("__failures__", {})[model_type] = failures[folder]
    return found


def _shrink(d: dict[str, Any]) -> dict[str, Any]:
    """GENERIC_SIZES (and STAGE_SIZES) applied to a config dict and its sub-configs. The layers kept are
    representative (_kept_layers): per-layer lists (layer_types and the like, as long as the old layer count) and
    per-layer configs keyed by layer index follow them. Token ids stay inside the shrunk vocabulary."""
    d = {**d, **STAGE_SIZES.get(d.get("model_type"), {})}
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and "model_type" in value:
            out[key] = _shrink(value)
        elif key in GENERIC_SIZES and isinstance(value, int) and not isinstance(value, bool) and value > GENERIC_SIZES[key]:
            out[key] = GENERIC_SIZES[key]
        else:
            out[key] = value
    layers = d.get("num_hidden_layers")
    if isinstance(layers, int) and layers != out["num_hidden_layers"]:
        kept = _kept_layers(d.get("layer_types"), layers, out["num_hidden_layers"])
        out["num_hidden_layers"] = len(kept)
        for key, value in out.items():
            if isinstance(value, list) and len(value) == layers:
                out[key] = [value[i] for i in kept]
        if isinstance(out.get("per_layer_config"), dict):
            out["per_layer_config"] = _per_layer(out["per_layer_config"], kept)
    if "num_attention_heads" in out and "num_key_value_heads" in out and isinstance(out["num_key_value_heads"], int):
        out["num_key_value_heads"] = min(out["num_key_value_heads"], out["num_attention_heads"])
    if isinstance(out.get("kv_lora_rank"), int):  # latent attention: one key and value per head, derived sizes kept
        if isinstance(out.get("num_key_value_heads"), int):
            out["num_key_value_heads"] = out["num_attention_heads"]
        if isinstance(out.get("qk_head_dim"), int):
            out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    if any(out.get(k) != d.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        for key, cap in ROUTING_SIZES.items():  # top-k and expert groups within the experts left
            if isinstance(out.get(key), int) and out[key] > cap:
                out[key] = cap
        if isinstance(out.get("topk_group"), int) and isinstance(out.get("n_group"), int):
            out["topk_group"] = min(out["topk_group"], out["n_group"])
    if _takes_mrope(d.get("model_type")) and isinstance(out.get("rope_parameters"), dict):
        out["rope_parameters"].setdefault("mrope_section", [16, 24, 24])  # the modeling code's default when unset
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(out.get(key), dict) and isinstance(out[key].get("mrope_section"), list):
            partial = out[key].get("partial_rotary_factor", out.get("partial_rotary_factor")) or 1.0
            rotary = int((_head_dim(out) or 0) * partial)
            out[key] = {**out[key], "mrope_section": _mrope_section(out[key]["mrope_section"], rotary)}
    ids = [v for k, v in out.items() if k.endswith("token_id") and isinstance(v, int) and not isinstance(v, bool)]
    if isinstance(out.get("vocab_size"), int) and ids and max(ids) >= out["vocab_size"]:
        out["vocab_size"] = max(ids) + 1  # a pad id past the vocabulary fails nn.Embedding's padding_idx check
    for key, value in d.items():  # a composite's own widths tied to a sub-config's (Kimi K2.5's projection_hidden_size
        # is its tower's; Muse Glimmer's out_hidden_size its tower's times the merged patches): scaled with it
        if not key.endswith("hidden_size") or key in GENERIC_SIZES or not isinstance(value, int) or isinstance(value, bool):
            continue
        for sub in ("vision_config", "text_config"):
            old, new = (c.get(sub, {}).get("hidden_size") if isinstance(c.get(sub), dict) else None for c in (d, out))
            if isinstance(old, int) and isinstance(new, int) and old != new and value % old == 0:
                out[key] = value // old * new
                break
    text_hidden = [c.get("text_config", {}).get("hidden_size") if isinstance(c.get("text_config"), dict) else None
                   for c in (d, out)]
    vision = out.get("vision_config")
    if isinstance(vision, dict) and all(isinstance(h, int) for h in text_hidden) and text_hidden[0] != text_hidden[1]:
        for key, value in d["vision_config"].items():  # a tower's output width made for the text model (GLM-4.6V's and
            # EXAONE 4.5's out_hidden_size): the text model's shrunk width
            if (key.endswith("hidden_size") and key not in GENERIC_SIZES and isinstance(value, int)
                    and not isinstance(value, bool) and value == text_hidden[0]):
                out["vision_config"] = vision = {**vision, key: text_hidden[1]}
    text, image = out.get("text_config"), out.get("image_token_id", out.get("image_token_index"))
    if (isinstance(text, dict) and isinstance(text.get("vocab_size"), int) and isinstance(image, int)
            and not isinstance(image, bool) and image >= text["vocab_size"]):
        # a vision-language model's image token, which its forward embeds with the text model's table: inside the
        # shrunk text vocabulary (its other ids, such as an audio model's, would grow the table past a tiny model)
        out["text_config"] = {**text, "vocab_size": image + 1}
    return out


def _takes_mrope(model_type: Any) -> bool:
    """Whether the config class reads multimodal rotary sections (Qwen2-VL's, GLM-4V's) from its rope parameters."""
    from transformers import CONFIG_MAPPING

    try:
        config_cls = CONFIG_MAPPING[model_type]
    except KeyError:
        return False
    return "mrope_section" in getattr(config_cls, "ignore_keys_at_rope_validation", ())


def _head_dim(config: dict[str, Any]) -> int | None:
    head_dim = config.get("head_dim")
    if isinstance(head_dim, int):
        return head_dim
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def _mrope_section(section: list[int], rotary_dim: int) -> list[int]:
    """Qwen2-VL's rotary sections (time, height, width) sum to half the rotary dims: scaled to the shrunk ones, each
    at least 1, the last taking what rounding left."""
    total = rotary_dim // 2
    if total < len(section) or sum(section) == total:
        return section
    scaled = [max(1, round(part * total / sum(section))) for part in section[:-1]]
    return [*scaled, max(1, total - sum(scaled))]


def _kept_layers(layer_types: Any, layers: int, count: int) -> list[int]:
    """The first layer of each kind (sliding and full attention, linear attention, ...), then the first others, up to
    `count` or the number of kinds: two sliding layers would leave a model's full attention untested, and some
    configs refuse a layer list without one."""
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        return list(range(count))
    kinds = [layer_types.index(kind) for kind in dict.fromkeys(map(str, layer_types))]
    rest = [i for i in range(layers) if i not in kinds]
    return sorted(kinds + rest[: max(0, count - len(kinds))])


def _per_layer(config: dict[str, Any], kept: list[int]) -> dict[str, Any]:
    """A per-layer config keyed by layer index (an int, or its digits as a string), keyed by the kept layers' new
    indices; the layers left out drop their entries."""
    out = {}
    for key, value in config.items():
        index = int(key) if str(key).isdigit() else None
        if index in kept:
            new = kept.index(index)
            out[str(new).zfill(len(key)) if isinstance(key, str) else new] = value
    return out


def own_classes(model_type: str) -> list[str]:
    """The model classes transformers exports whose config is this model type's, abstract bases left out.
    A model type with no auto-mapped base model (a depth estimator, a backbone, a vision tower that is also
    a sub-config) runs these; one with none is a part of another model with no class of its own."""
    import pkgutil

    import transformers
    from transformers import CONFIG_MAPPING, PreTrainedModel

    config_cls = CONFIG_MAPPING[model_type]
    package = importlib.import_module(config_cls.__module__.rsplit(".", 1)[0])
    found: list[str] = []
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("modeling_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if (isinstance(obj, type) and issubclass(obj, PreTrainedModel) and obj.__module__ == module.__name__
                    and getattr(obj, "config_class", None) is config_cls and "PreTrainedModel" not in name
                    and getattr(transformers, name, None) is obj and name not in found):
                found.append(name)
    return sorted(found, key=lambda name: "Head" in name)  # a head of parts (SLANetSLAHead) is no model to run


def generic(model_type: str) -> dict[str, Any]:
    """The default config shrunk to GENERIC_SIZES, with inputs guessed from the main input of the model it
    runs (the auto-mapped base model, else the first class of its own)."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    config_cls = CONFIG_MAPPING[model_type]
    config = config_cls.from_dict(_shrink(config_cls().to_dict()))
    classes = [] if model_type in modeling_auto.MODEL_MAPPING_NAMES else own_classes(model_type)
    entry: dict[str, Any] = {"model_type": model_type, "source": "generic", "config": _config_dict(config),
                             "inputs": [], "model_classes": classes}
    base = modeling_auto.MODEL_MAPPING_NAMES.get(model_type) or (classes[0] if classes else None)
    main = "input_ids"
    if base:
        cls = getattr(transformers, base if isinstance(base, str) else base[0], None)
        main = getattr(cls, "main_input_name", "input_ids") if cls is not None else main
        params = list(inspect.signature(cls.forward).parameters) if cls is not None else [main]
        if main not in params:  # the default name, left unset by a model that takes another input
            main = next((p for p in ("pixel_values", "input_ids") if p in params), params[1] if len(params) > 1 else main)
    if main == "input_ids":
        vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None) or 100
        entry["inputs"] = [{"name": "input_ids", "shape": [2, 8], "dtype": "int64", "kind": "int", "low": 0, "high": int(vocab)}]
    elif main == "pixel_values":
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        channels = getattr(vision, "num_channels", 3)
        entry["inputs"] = [{"name": "pixel_values", "shape": [2, channels, size, size], "dtype": "float32", "kind": "randn"}]
    elif main in ("input_features", "input_values") and base:
        entry["inputs"] = _audio_inputs(model_type, entry, main, base if isinstance(base, str) else base[0])
        if not entry["inputs"]:
            entry["note"] = f"no generic {main} shape that the model runs"
    else:
        entry["note"] = f"no generic inputs for main input {main!r}"
    return entry


def _audio_inputs(model_type: str, entry: dict[str, Any], main: str, class_name: str) -> list[dict[str, Any]]:
    """Audio inputs lay their dims out per model (features channel-first as Whisper's, or time-first as a
    Conformer's; waveforms with or without a channel dim), so each usual layout is tried on the model itself, built
    from the generic config, and the first its forward runs on is kept ([] if none)."""
    import torch

    from benchmarks.hf_sweep import run

    config = entry["config"]
    def sub(*names):
        for holder in (config, *(v for v in config.values() if isinstance(v, dict))):
            for name in names:
                if isinstance(holder.get(name), int):
                    return holder[name]
        return None

    if main == "input_features":
        bins = sub("num_mel_bins", "feature_size", "input_feat_size", "n_mels", "num_mel_filters") or 80
        shapes = [[2, bins, frames] for frames in (64, 3000)] + [[2, frames, bins] for frames in (64, 200)]
    else:
        channels = sub("audio_channels", "channels", "num_channels") or 1
        shapes = [[2, 1600], [2, channels, 1600], [2, 16000], [2, channels, 16000]]
    try:
        model = run.build({**entry, "model_type": model_type}, class_name)
    except Exception:  # noqa: BLE001 - a model that does not build has no inputs to find
        return []
    for shape in shapes:
        spec = [{"name": main, "shape": shape, "dtype": "float32", "kind": "randn"}]
        try:
            with torch.no_grad():
                model(**run.make_inputs(spec))
        except Exception:  # noqa: BLE001 - the next layout
            continue
        return spec
    return []


def dump(data: dict[str, Any]) -> str:
    """JSON with one line per model type, so that a re-extraction's diff shows which ones changed."""
    head = {k: v for k, v in data.items() if k != "configs"}
    lines = [json.dumps(head)[:-1] + ', "configs": {']
    items = list(data["configs"].items())
    lines += [f" {json.dumps(k)}: {json.dumps(v)}" + ("," if i < len(items) - 1 else "") for i, (k, v) in enumerate(items)]
    return "\n".join(lines) + "\n}}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path, nargs="?", help="a transformers source tree with tests/ and utils/")
    parser.add_argument("--out", type=Path, default=CONFIGS)
    parser.add_argument("--label", default="transformers tests/", help="how configs.json names the checkout")
    parser.add_argument("--only", nargs="*", help="model types to extract (default: all registered)")
    parser.add_argument("--merge", action="store_true", help="update these model types in the existing --out file")
    parser.add_argument("--generic-only", action="store_true",
                        help="recompute only the generic entries of these model types (no checkout needed; implies --merge)")
    ns = parser.parse_args()
    if ns.checkout is None and not ns.generic_only:
        parser.error("a transformers checkout is needed (or --generic-only)")

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_types = ns.only or sorted(CONFIG_MAPPING_NAMES)
    if ns.generic_only:
        ns.merge = True
        old = json.loads(ns.out.read_text())["configs"]
        model_types = [t for t in model_types if old.get(t, {}).get("source", "generic") == "generic"]
        import_failures = {t: old[t]["tester_failure"] for t in model_types if "tester_failure" in old.get(t, {})}
    found = {} if ns.generic_only else scan_tests(ns.checkout.resolve(), model_types)
    if not ns.generic_only:
        import_failures = found.pop("__failures__", {})
    entries = {}
    for model_type in model_types:
        if model_type in found:
            entries[model_type] = found[model_type]
            continue
        try:
            entries[model_type] = generic(model_type)
        except Exception as err:
            entries[model_type] = {"model_type": model_type, "source": "generic", "config": None, "inputs": [],
                                   "model_classes": [], "note": f"default config fails: {type(err).__name__}: {err}"[:200]}
        if model_type in import_failures:
            entries[model_type]["tester_failure"] = import_failures[model_type]
    if ns.merge and ns.out.exists():
        entries = {**json.loads(ns.out.read_text())["configs"], **entries}
    label = json.loads(ns.out.read_text()).get("tests_source", ns.label) if ns.generic_only else ns.label
    data = {"transformers": transformers.__version__, "tests_source": label,
            "generic_sizes": GENERIC_SIZES, "configs": entries}
    tmp = ns.out.with_name(ns.out.name + ".tmp")
    tmp.write_text(dump(data))
    os.replace(tmp, ns.out)  # a sweep running meanwhile reads the old file or the new one
    by_source = {s: sum(e["source"] == s for e in entries.values()) for s in ("tester", "generic")}
    print(f"{len(entries)} model types: {by_source}")


if __name__ == "__main__":
    main()
