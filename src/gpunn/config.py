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
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpunn import experiments
from gpunn.backends import registry as variants
from gpunn.configcheck import CPU_MACHINE, SIMULATOR_MACHINE, check_dataset, check_variants
from gpunn.errors import GpunnError

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def read_config_file(path: str | Path) -> dict:
    """A config file's mapping (an empty file: {}); one GpunnError line naming the file, and for bad YAML its line
    and column and what is wrong there (a tab in the indentation said as such), where yaml's error takes ten."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GpunnError(f"no such config file {str(path)!r}: check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise GpunnError(f"{path}: cannot read the config file ({why})") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GpunnError(yaml_error_line(path, exc, text)) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise GpunnError(f"{path}: a config file must be a mapping of keys to values, got a {type(loaded).__name__}")
    return loaded


def yaml_error_line(path: str | Path, exc: yaml.YAMLError, text: str) -> str:
    """'config/x.yaml line 3, column 1: not valid YAML (found character '\\t' that cannot start any token); ...'."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).split("\n", 1)[0]
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    lines = text.splitlines()
    bad_line = lines[mark.line] if mark is not None and mark.line < len(lines) else ""
    tab = "\t" in problem or "\t" in bad_line[: len(bad_line) - len(bad_line.lstrip())]
    fix = ("YAML indents with spaces only: replace the tab(s) on that line with spaces" if tab
           else "fix the YAML there (indentation, a missing ':' or an unclosed quote or bracket)")
    return f"{path}{where}: not valid YAML ({problem}); {fix}"


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


def _check_registries(config: dict) -> None:
    """Every experiment that trains a model: its datasets and variants (configcheck), a variant listed while it is
    enabled; then each experiment's own checks (Experiment.check)."""
    exps = config["experiments"]
    simulator = config["gpu"]["simulator"]
    for experiment in experiments.ALL:
        name, block = experiment.name, exps[experiment.name]
        if experiment.model is None:
            continue
        for key in ("dataset", "datasets"):
            if key in block:
                names = block[key] if key == "datasets" else [block[key]]
                for i, dataset in enumerate(names):
                    check_dataset(f"experiments.{name}.{key}" + (f"[{i}]" if key == "datasets" else ""), dataset,
                                  experiment.model)
        check_variants(f"experiments.{name}.variants", block["variants"], experiment.model, simulator)
        if not block["variants"] and block["enabled"]:
            dropped = "" if config["gpu"]["enabled"] else " once gpu.enabled: false drops the GPU variants"
            raise GpunnError(f"config key experiments.{name}.variants is empty{dropped}"
                             + f"; list a variant or set experiments.{name}.enabled: false")
    for experiment in experiments.ALL:
        if experiment.check is not None:
            experiment.check(config)


def _drop_gpu_jobs(config: dict, log: Callable[[str], None]) -> None:
    """gpu.enabled false: every GPU variant leaves every experiment, and each experiment drops what else needs a GPU
    (Experiment.without_gpu: E3's kernel block sweep, E4's block-size study, E6's SVM kernel on the GPU)."""
    dropped, notes = set(), []
    for experiment in experiments.ALL:
        block = config["experiments"][experiment.name]
        if experiment.model is not None:
            kept = [v for v in block["variants"] if not variants.uses_gpu(v)]
            dropped.update(set(block["variants"]) - set(kept))
            block["variants"] = kept
        if experiment.without_gpu is not None:
            notes += experiment.without_gpu(config)
    if dropped or notes:
        log(f"gpunn: gpu.enabled is false: not running {', '.join(sorted(dropped)) or 'any GPU variant'}"
            + "".join(f"; {note}" for note in notes))


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


def detect_gpu_ids(timeout_s: float = 10.0) -> list[str]:
    """The ids of the GPUs that jobs may use: CUDA_VISIBLE_DEVICES's entries when it is set (a cluster's or the
    user's choice), else nvidia-smi's indices; [] without any."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        return [] if ids[:1] == ["-1"] else ids
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def gpu_slots(config: dict, gpu_ids: Callable[[], list[str]] = detect_gpu_ids) -> list[str]:
    """The GPU ids that config key `gpus` places GPU jobs on (gpunn.placement): every GPU found (auto) or the first
    N; under gpu.simulator N simulated ones ("0".."N-1"; auto: none); none when GPU jobs are off. GpunnError when
    more are asked for than found."""
    setting = config["gpus"]
    if not config["gpu"]["enabled"]:
        return []
    if config["gpu"]["simulator"]:
        return [] if setting == "auto" else [str(i) for i in range(setting)]
    found = gpu_ids()
    if setting == "auto":
        return found
    if found and setting > len(found):
        raise GpunnError(f"config key gpus: {setting} GPUs asked for, {len(found)} found ({','.join(found)}); "
                         f"give at most {len(found)}, or auto")
    return found[:setting] if found else [str(i) for i in range(setting)]


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
    config["machine"] = resolve_machine(config, gpu_name)  # before the checks: E6's method auto follows it
    _check_registries(config)
    if config.get("cpu_lanes", 1) > 1 and config.get("timing") != "overlap":
        raise GpunnError(f"config key cpu_lanes: {config['cpu_lanes']} lanes need timing: overlap (under "
                         f"{config.get('timing')} one timed job runs at a time); set timing: overlap or cpu_lanes: 1")
    return config


def missing_gpu_note(raw: dict, config: dict) -> str | None:
    """The line to print once when a planned job needs a GPU that this machine lacks (the machine found by
    nvidia-smi, not set by hand, is the CPU while GPU variants are enabled), else None."""
    if config["machine"] != CPU_MACHINE or not config["gpu"]["enabled"] or raw.get("machine", "auto") != "auto":
        return None
    return ("gpunn: note: no GPU found here (nvidia-smi), yet GPU jobs are planned and will stop with an error; for "
            "the CPU-only reproduction use --configfile config/cpu.yaml (gpu.enabled: false)")

