"""The pipeline's configuration: read leniently, checked early, completed with derived settings.

Snakemake hands the Snakefile a config merged from config/config.yaml, `--configfile` and `--config`. Before
any job is planned, `load_config` turns it into the validated config every rule reads:

  1. numbers and booleans written as text are read as what they say: `--config data='{timeout_s: 2}'` gives
     nested values as strings, and YAML 1.1 reads `lr: 1e-3` as a string; both are accepted when the
     schema wants a number (or boolean) there and the text parses as one;
  2. unknown keys, wrong types and out-of-range values are one line naming the key
     (`config key experiments.e1.batch: ...`), not Snakemake's dump of the whole schema;
  3. names are checked against the registries: datasets (gpunn.data.registry), variants and the models
     each supports (gpunn.backends.registry), E5 images the autoencoder can take, E6's variant among E5's;
  4. derived settings are filled in: `machine` (which device's timings these are: "cudasim" under the
     simulator, the GPU's name, or "cpu"), and, with `gpu.enabled: false`, every GPU job dropped. On a
     cluster, `machine` must also be named when GPU jobs run there (gpunn.cluster, checked at onstart).

Every problem is a GpunnError with a one-line message; workflow/rules/common.smk prints it and exits.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import yaml

from gpunn.backends import registry as variants
from gpunn.errors import GpunnError

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"

# which model each experiment trains (E3 times the MLP's steps; E6 reuses an E5 run)
EXPERIMENT_MODELS = {"e1": "mlp", "e2": "mlp", "e3": "mlp", "e4": "cnn", "e5": "autoencoder"}
SIMULATOR_MACHINE = "cudasim"
CPU_MACHINE = "cpu"
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def load_schema(path: str | Path = SCHEMA_PATH) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _key(path: tuple) -> str:
    return ".".join(str(p) for p in path) if path else "(top level)"


def _types(node: dict) -> list[str]:
    kind = node.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def _coerce_scalar(value: Any, node: dict) -> Any:
    """A string that the schema wants as a number or boolean, read as one (else left for validation)."""
    if not isinstance(value, str):
        return value
    kinds = _types(node)
    text = value.strip()
    if "integer" in kinds and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if "number" in kinds or "integer" in kinds:
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            if "number" in kinds:
                return number
            if number.is_integer():
                return int(number)
    if "boolean" in kinds and text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    return value


def coerce(value: Any, node: dict) -> Any:
    """`value` with every string that stands where the schema wants a number or boolean converted."""
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")  # a mapping's values (e5.variant_epochs): one schema for all
        extra = extra if isinstance(extra, dict) else {}
        return {k: coerce(v, props.get(k, extra)) for k, v in value.items()}
    if isinstance(value, list):
        items = node.get("items", {})
        return [coerce(v, items) for v in value]
    return _coerce_scalar(value, node)


def _check_keys(value: Any, node: dict, path: tuple) -> None:
    """Unknown keys, as one line naming the key and the known ones (the schema forbids extra keys)."""
    if not isinstance(value, dict) or "properties" not in node:
        return
    known = node["properties"]
    for key, sub in value.items():
        if key not in known:
            raise GpunnError(f"config key {_key(path + (key,))} is unknown; known keys here: {', '.join(known)}")
        _check_keys(sub, known[key], path + (key,))


def _fill_defaults(value: dict, node: dict) -> None:
    for key, sub in node.get("properties", {}).items():
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if isinstance(value.get(key), dict):
            _fill_defaults(value[key], sub)


def _schema_errors(config: dict, schema: dict) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        raise GpunnError(f"config key {_key(tuple(error.absolute_path))}: {error.message}")


def _choice_error(key: str, value, choices, why: str = "") -> GpunnError:
    return GpunnError(f"config key {key} = {value!r}{why}; choose one of {', '.join(map(str, choices))}")


def _check_dataset(key: str, name, model: str | None = None) -> None:
    from gpunn.data.registry import DATASETS

    if name not in DATASETS:
        raise _choice_error(key, name, DATASETS, " is not a known dataset")
    if model == "autoencoder":
        _, height, width = DATASETS[name].image_shape
        if height != width or height % 4:
            fits = [n for n, s in DATASETS.items() if s.image_shape[1] == s.image_shape[2] and s.image_shape[1] % 4 == 0]
            raise _choice_error(key, name, fits, f" has {height}x{width} images; the autoencoder needs square "
                                                 "images with a side divisible by 4")


def _check_variants(key: str, names, model: str, simulator: bool) -> None:
    if len(set(names)) != len(names):
        raise GpunnError(f"config key {key} lists a variant twice: {list(names)}")
    for name in names:
        if name not in variants.VARIANTS:
            raise _choice_error(key, name, variants.VARIANTS, " is not a known variant")
        if model not in variants.supported_models(name):
            raise _choice_error(key, name, variants.variants_for(model), f" does not train the {model}")
        if simulator and not variants.runs_on_simulator(name):
            raise _choice_error(key, name, variants.variants_for(model, simulator=True),
                                " cannot run under the CUDA simulator (gpu.simulator: true)")


def _check_block_study(e4: dict, simulator: bool) -> None:
    """E4's block-size study: GPU variants that take a block size, a known dataset, no size twice."""
    _check_variants("experiments.e4.block_variants", e4["block_variants"], "cnn", simulator)
    for name in e4["block_variants"]:
        if not variants.takes_block(name):
            fits = [v for v in variants.VARIANTS if variants.takes_block(v) and "cnn" in variants.supported_models(v)]
            raise _choice_error("experiments.e4.block_variants", name, fits, " takes no block size")
    if len(set(e4["block_sizes"])) != len(e4["block_sizes"]):
        raise GpunnError(f"config key experiments.e4.block_sizes lists a size twice: {e4['block_sizes']}")
    if e4["block_variants"] and not e4["block_sizes"]:
        raise GpunnError("config key experiments.e4.block_sizes is empty while experiments.e4.block_variants "
                         "lists variants; list block sizes or set block_variants: []")
    if e4["block_variants"]:
        _check_dataset("experiments.e4.block_dataset", e4["block_dataset"], "cnn")


def _check_registries(config: dict) -> None:
    exps = config["experiments"]
    simulator = config["gpu"]["simulator"]
    for exp, model in EXPERIMENT_MODELS.items():
        if exp != "e3":
            for key in ("dataset", "datasets"):
                if key in exps[exp]:
                    names = exps[exp][key] if key == "datasets" else [exps[exp][key]]
                    for i, name in enumerate(names):
                        where = f"experiments.{exp}.{key}" + (f"[{i}]" if key == "datasets" else "")
                        _check_dataset(where, name, model)
        _check_variants(f"experiments.{exp}.variants", exps[exp]["variants"], model, simulator)
    _check_block_study(exps["e4"], simulator)
    for exp in EXPERIMENT_MODELS:
        if not exps[exp]["variants"] and exps[exp]["enabled"]:
            raise GpunnError(f"config key experiments.{exp}.variants is empty"
                             + (" once gpu.enabled: false drops the GPU variants" if not config["gpu"]["enabled"] else "")
                             + f"; list a variant or set experiments.{exp}.enabled: false")
    unknown = sorted(set(exps["e5"]["variant_epochs"]) - set(exps["e5"]["variants"]))
    if unknown:
        raise _choice_error("experiments.e5.variant_epochs", unknown[0], exps["e5"]["variants"],
                            " is not one of experiments.e5.variants")
    if exps["e6"]["variant"] == E6_AUTO:
        exps["e6"]["variant"] = e6_auto_variant(exps["e5"]["variants"])
    if exps["e6"]["variant"] not in exps["e5"]["variants"]:
        raise _choice_error("experiments.e6.variant", exps["e6"]["variant"], exps["e5"]["variants"],
                            " is not one of experiments.e5.variants")
    subset = exps["e6"]["train_subset"]
    if isinstance(subset, str) and subset != "auto":
        raise _choice_error("experiments.e6.train_subset", subset, ["auto", "0 (all rows)", "a row count"])
    gamma = exps["e6"]["gamma"]
    if isinstance(gamma, str) and gamma not in ("scale", "auto"):
        raise _choice_error("experiments.e6.gamma", gamma, ["scale", "auto", "a positive number"])
    if not isinstance(gamma, str) and not gamma > 0:
        raise GpunnError(f"config key experiments.e6.gamma = {gamma!r}: a number must be positive")


E6_AUTO = "auto"
# E6's `auto` encoder: the fastest GPU variant E5 trains, on the full training set
E6_AUTO_ORDER = ("gpu-graph", "gpu-im2col", "gpu-tiled", "gpu-naive")


def e6_auto_variant(e5_variants) -> str | None:
    """The E5 variant whose encoder E6 uses when experiments.e6.variant is auto."""
    for name in E6_AUTO_ORDER:
        if name in e5_variants:
            return name
    return e5_variants[0] if e5_variants else None


def _drop_gpu_jobs(config: dict, log: Callable[[str], None]) -> None:
    """gpu.enabled false: every GPU variant leaves every experiment, E3's kernel block sweep is not run, and
    E6 computes its SVM kernel on the CPU (kernel_device auto or gpu becomes cpu)."""
    e6 = config["experiments"]["e6"]
    gpu_kernel = e6["kernel_device"] == "gpu"
    e6["kernel_device"] = "cpu"
    dropped = set()
    for exp in EXPERIMENT_MODELS:
        kept = [v for v in config["experiments"][exp]["variants"] if not variants.uses_gpu(v)]
        dropped.update(set(config["experiments"][exp]["variants"]) - set(kept))
        config["experiments"][exp]["variants"] = kept
    e5 = config["experiments"]["e5"]
    e5["variant_epochs"] = {name: epochs for name, epochs in e5["variant_epochs"].items() if name in e5["variants"]}
    study = config["experiments"]["e4"]
    dropped.update(study["block_variants"])
    study["block_variants"] = []
    if dropped or gpu_kernel:
        log(f"gpunn: gpu.enabled is false: not running {', '.join(sorted(dropped)) or 'any GPU variant'} nor "
            "E3's block sweep nor E4's block-size study" + (", and E6's SVM kernel is computed on the CPU "
                                                           "(experiments.e6.kernel_device: gpu ignored)"
                                                           if gpu_kernel else ""))


def detect_gpu_name(timeout_s: float = 10.0) -> str | None:
    """The first GPU's name from nvidia-smi (cheap: no CUDA context), or None without a usable one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names[0] if out.returncode == 0 and names else None


def machine_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3': a folder name that keeps devices apart."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-.") or CPU_MACHINE


def resolve_machine(config: dict, gpu_name: Callable[[], str | None] = detect_gpu_name) -> str:
    """Which device's timings this config produces: its `machine` key, else "cudasim" under the simulator,
    the GPU's name when one is there and GPU jobs are on, or "cpu"."""
    if config["machine"] != "auto":
        return config["machine"]
    if config["gpu"]["simulator"]:
        return SIMULATOR_MACHINE
    name = gpu_name() if config["gpu"]["enabled"] else None
    return machine_slug(name) if name else CPU_MACHINE


def load_config(raw: dict, schema: dict | None = None, log: Callable[[str], None] = print,
                gpu_name: Callable[[], str | None] = detect_gpu_name) -> dict:
    """The validated, completed config (a new dict); GpunnError with one line on the first problem."""
    schema = schema if schema is not None else load_schema()
    if not isinstance(raw, dict):
        raise GpunnError(f"the config must be a mapping of keys to values, got {type(raw).__name__}")
    config = coerce(copy.deepcopy(raw), schema)
    _check_keys(config, schema, ())
    _fill_defaults(config, schema)
    _schema_errors(config, schema)
    if config["gpu"]["simulator"] and not config["gpu"]["enabled"]:
        raise GpunnError("config keys gpu.simulator and gpu.enabled: the simulator runs GPU jobs, which "
                         "gpu.enabled: false drops; set one of them")
    if not config["gpu"]["enabled"]:
        _drop_gpu_jobs(config, log)
    _check_registries(config)
    config["machine"] = resolve_machine(config, gpu_name)
    return config


def missing_gpu_note(raw: dict, config: dict) -> str | None:
    """The line to print once when a planned job needs a GPU that this machine lacks (the machine found by
    nvidia-smi, not set by hand, is the CPU while GPU variants are enabled), else None."""
    if config["machine"] != CPU_MACHINE or not config["gpu"]["enabled"] or raw.get("machine", "auto") != "auto":
        return None
    return ("gpunn: note: no GPU found here (nvidia-smi), yet GPU jobs are planned and will stop with an error; for "
            "the CPU-only reproduction use --configfile config/cpu.yaml (gpu.enabled: false)")

