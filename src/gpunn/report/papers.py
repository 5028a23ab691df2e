"""The papers' numbers as data: every value of the seeds' result tables, and the headline numbers their text
states (accuracies, times, speedups, losses per epoch, MSE, memory, the SVM's accuracies and time), each with
where it stands in the seed, what it measures, its unit, the text as printed and the setting it was measured in.

The seeds are the five papers under ../shared/seeds (see ../shared/ANCHORS.md, section 1):

    E1  000_db1707331904318f.txt  MLP on MNIST, CPU against a T4
    E2  002_2b64d4e77899e131.txt  MLP hidden x batch sweep: serial, naive GPU, device memory, tiled forward
    E3  003_4a1c4467d7dd6247.txt  a project plan: its expected speedup and its tolerance
    E4  001_52ad73420a0f8af8.txt  CNN on MNIST and FASHION: PyTorch (Tables 1-2), naive and optimized CUDA on three
                                  GPUs (Tables 3-6), block sizes
    E5  004_4f268e64550dc30e.txt  convolutional autoencoder on CIFAR-10: CPU, GPU naive, optimized v1 and v2
    E6  004_4f268e64550dc30e.txt  SVM on the encoder's features

Left out on purpose: numbers that are theory or design (seed 000's FLOP and memory tables, its A100 peak),
settings (batch sizes, block sizes, epochs: they are the entries' settings instead), profiler shares of kernel
time (seed 004's 84.4 % ...), and the text's re-statements of a table value with less precision ("from 1.85s to
0.84s", "0.09-0.13 seconds", "29,678 seconds per epoch" in a formula). Where the seed contradicts itself, both
numbers are kept and the entry's note says so.

Each PaperValue's `text` is the number exactly as printed (thousands commas kept, '%' and '×' not), so the
printed precision survives; `value` is it as a float in `unit`. `anchor` is text of the seed, found in order,
after which the value stands (before it, for a table whose caption is below it: `caption_below`), and `row` /
`column` the labels of its table cell as printed: tests/test_papers.py checks every entry against the seed file.
`phase` is the paper's name for the implementation (or device) a value belongs to; PHASES maps it, per seed, to
the gpunn variants that reproduce it (the first one preferred; none: gpunn has no counterpart).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from gpunn.errors import GpunnError

SEED_E1 = "000_db1707331904318f.txt"
SEED_E4 = "001_52ad73420a0f8af8.txt"
SEED_E2 = "002_2b64d4e77899e131.txt"
SEED_E3 = "003_4a1c4467d7dd6247.txt"
SEED_E5 = "004_4f268e64550dc30e.txt"  # E5 and E6
SEEDS = {"e1": SEED_E1, "e2": SEED_E2, "e3": SEED_E3, "e4": SEED_E4, "e5": SEED_E5, "e6": SEED_E5}

QUANTITIES = {  # name: what it measures
    "train_time": "training time over all epochs",
    "epoch_time": "time of one training epoch",
    "block_time": "training time of a block of 100 images",
    "test_time": "the test set through the trained model once",
    "forward_time": "forward-pass time summed over training",
    "backward_time": "backpropagation time summed over training",
    "fit_time": "SVM training time",
    "speedup": "the `versus` phase's time over this phase's",
    "expected_speedup": "a speedup the paper expects or targets, not measures",
    "time_reduction": "training time saved against the `versus` phase, in % of its time",
    "memory_reduction": "host memory saved against the `versus` phase, in % of its memory",
    "test_accuracy": "accuracy on the test set",
    "train_accuracy": "accuracy on the training set",
    "expected_accuracy": "an accuracy the paper expected",
    "accuracy_gap": "the `versus` phase's test accuracy minus this phase's",
    "train_loss": "mean training loss of an epoch (`epoch`; None: the last)",
    "train_mse": "mean training MSE of an epoch (`epoch`; None: the last)",
    "test_mse": "MSE on the test set after training",
    "gpu_memory": "GPU memory the training used",
    "host_memory": "host memory the training used",
    "parameters": "trainable parameters of the model",
    "relative_error": "a tolerance: GPU against CPU, relative error",
}
TIME_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0}  # unit: seconds
UNITS = {**{u: "time" for u in TIME_UNITS}, "%": "percent", "fraction": "a fraction in [0, 1]",
         "pp": "percentage points", "x": "times (a ratio of times)", "CE": "cross-entropy per sample",
         "MSE": "mean squared error", "MiB": "2^20 bytes", "count": "a number of things", "relative": "a relative error"}


@dataclass(frozen=True)
class PaperValue:
    """One number of a seed, as printed, in its setting (module docstring)."""

    experiment: str            # e1 ... e6
    seed: str                  # the seed's file name under ../shared/seeds
    source: str                # the table or section as the seed names it
    anchor: tuple[str, ...]    # seed text found in this order; the value stands after the last (caption_below: before)
    quantity: str              # a key of QUANTITIES
    unit: str                  # a key of UNITS
    text: str                  # the number as printed (a range: its lower bound)
    phase: str                 # the paper's implementation or device; PHASES[seed][phase]: our variants
    hardware: str              # what the paper ran it on
    dataset: str
    n_train: int | None = None
    n_test: int | None = None
    batch: int | None = None
    epochs: int | None = None
    row: str | None = None     # table cell: row and column labels as printed (None: running text)
    column: str | None = None
    caption_below: bool = False
    versus: str | None = None  # the other phase of a speedup, gap or reduction (the baseline)
    upper_text: str | None = None  # a range's upper bound as printed ("5-50x": text "5", upper_text "50")
    hidden: int | None = None
    block: int | None = None   # threads per block
    epoch: int | None = None   # the epoch of a per-epoch value
    workers: int | None = None  # seed 001's PyTorch DataLoader settings
    pin_memory: bool | None = None
    note: str = ""

    @property
    def number(self) -> Decimal:
        """The printed number, exactly (Decimal keeps its precision)."""
        return Decimal(self.text.replace(",", ""))

    @property
    def value(self) -> float:
        return float(self.number)

    @property
    def upper(self) -> float | None:
        return None if self.upper_text is None else float(Decimal(self.upper_text.replace(",", "")))

    @property
    def decimals(self) -> int:
        """Digits printed after the decimal point."""
        return max(0, -self.number.as_tuple().exponent)

    @property
    def ours(self) -> tuple[str, ...]:
        """The gpunn variants that reproduce this phase, the first preferred; () where gpunn has none."""
        return PHASES[self.seed][self.phase]

    @property
    def seconds(self) -> float | None:
        """A time in seconds (None: not a time)."""
        return self.value * TIME_UNITS[self.unit] if self.unit in TIME_UNITS else None


# Per seed: the paper's phase -> the gpunn variants that reproduce it (first preferred). For E6, our SVM method
# (experiments.e6.method) instead of a training variant.
PHASES: dict[str, dict[str, tuple[str, ...]]] = {
    # seed 000's CPU is a serial loop implementation (298 s for 10 MNIST epochs); its GPU one kernel per op,
    # atomic bias gradients, the batch copied every step: our gpu-naive
    SEED_E1: {"CPU": ("cpu-serial", "cpu-numpy"), "GPU": ("gpu-naive",)},
    # seed 002's naive GPU used unified memory; its optimization #1 moved to cudaMalloc + cudaMemcpy, as every
    # gpunn GPU variant does, and lost accuracy (uninitialised buffers): no variant of ours stands for it alone;
    # #2 tiled the forward GEMM only (gpu-tiled tiles the backward ones too)
    SEED_E2: {"Serial": ("cpu-serial",), "Naive": ("gpu-naive",), "Optimization #1": (),
              "Optimization #2": ("gpu-tiled",)},
    # seed 003 plans custom GPU kernels against a NumPy CPU baseline
    SEED_E3: {"NumPy CPU": ("cpu-numpy",), "GPU": ("gpu-naive", "gpu-tiled", "gpu-fused", "gpu-graph")},
    # seed 001: PyTorch on the CPU is its CPU baseline (cpu-numpy is ours); PyTorch on CUDA is not a pipeline
    # variant (python -m gpunn.bench cnn compares it)
    SEED_E4: {"PyTorch CPU": ("cpu-numpy",), "PyTorch CUDA": (), "naive": ("gpu-naive",),
              "optimized": ("gpu-optimized",)},
    # seed 004's phases 2.1-2.4 and its SVM (ours: the exact SVC of experiments.e6.method)
    SEED_E5: {"CPU": ("cpu-numpy",), "GPU naive": ("gpu-naive",), "GPU optimized v1": ("gpu-tiled",),
              "GPU optimized v2": ("gpu-im2col",), "cuML SVC": ("exact",)},
}

# seed 003 plans these batch sizes for its benchmarks (a setting, not a result)
E3_PLAN_BATCHES = (1, 8, 32, 128, 512)

# ------------------------------------------------------------------------------------------------ seed 000 (E1)
_E1_CPU, _E1_GPU = "CPU (model not stated)", "NVIDIA Tesla T4"
_E1 = dict(experiment="e1", seed=SEED_E1, dataset="mnist", n_train=60000, n_test=10000, batch=64, epochs=10,
           hidden=256)
_E1_HW = {"CPU": _E1_CPU, "GPU": _E1_GPU}
_E1_TABLE = dict(source="2.5 Experimental Results: Measured Performance", anchor=("Measured Performance:",), **_E1)
_E1_TEXT = dict(source="2.5 Experimental Results: Training Convergence", anchor=("Training Convergence:",), **_E1)


def _e1_cell(phase, row, quantity, unit, text, **extra):
    return PaperValue(quantity=quantity, unit=unit, text=text, phase=phase, hardware=_E1_HW[phase], row=row,
                      column=phase, **_E1_TABLE, **extra)


_SEED_000 = (
    _e1_cell("CPU", "Total training time", "train_time", "ms", "298617.53"),
    _e1_cell("CPU", "Total training time", "train_time", "s", "298.62"),
    _e1_cell("GPU", "Total training time", "train_time", "ms", "2247.11"),
    _e1_cell("GPU", "Total training time", "train_time", "s", "2.25"),
    _e1_cell("CPU", "Avg. time per epoch", "epoch_time", "s", "29.86"),
    _e1_cell("GPU", "Avg. time per epoch", "epoch_time", "s", "0.225"),
    _e1_cell("CPU", "Test accuracy", "test_accuracy", "%", "97.93"),
    _e1_cell("GPU", "Test accuracy", "test_accuracy", "%", "93.86"),
    PaperValue(quantity="train_loss", unit="CE", text="0.2257", phase="CPU", hardware=_E1_CPU, epoch=1, **_E1_TEXT),
    PaperValue(quantity="train_loss", unit="CE", text="0.0045", phase="CPU", hardware=_E1_CPU, epoch=10, **_E1_TEXT),
    PaperValue(quantity="train_loss", unit="CE", text="0.8420", phase="GPU", hardware=_E1_GPU, epoch=1, **_E1_TEXT,
               note="'rapid initial drop from 0.8420': epoch 1 read from section 3.5 ('0.8420 -> 0.4102 in 2 "
                    "epochs')"),
    PaperValue(quantity="train_loss", unit="CE", text="0.4102", phase="GPU", hardware=_E1_GPU, epoch=2, **_E1_TEXT),
    PaperValue(quantity="train_loss", unit="CE", text="0.2218", phase="GPU", hardware=_E1_GPU, epoch=10, **_E1_TEXT),
    PaperValue(quantity="speedup", unit="x", text="132.7", phase="GPU", versus="CPU",
               hardware=f"{_E1_GPU} vs {_E1_CPU}", **_E1_TEXT),
    PaperValue(quantity="accuracy_gap", unit="pp", text="4.1", phase="GPU", versus="CPU",
               hardware=f"{_E1_GPU} vs {_E1_CPU}", source="2.5 Experimental Results: Accuracy Analysis",
               anchor=("Accuracy Analysis:",), note="printed as 'a 4.1% difference'", **_E1),
    PaperValue(quantity="expected_speedup", unit="x", text="20", upper_text="100", phase="GPU", versus="CPU",
               hardware="a modern GPU vs a CPU (expectation)", source="2.3 Theoretical Performance Analysis",
               anchor=("2.3 Theoretical Performance Analysis", "Expected speedup over CPU"), **_E1),
)

# ------------------------------------------------------------------------------------------------ seed 002 (E2)
_E2_CPU, _E2_GPU = "CPU (not named in the seed)", "GPU (not named in the seed)"
_E2 = dict(experiment="e2", seed=SEED_E2, dataset="mnist", n_train=37800, n_test=4200, epochs=5)
_E2_ROWS = {"Training time (s)": ("train_time", "s"), "Forward propagation time (s)": ("forward_time", "s"),
            "Backpropagation time (s)": ("backward_time", "s"), "Test accuracy": ("test_accuracy", "fraction")}
_E2_HIDDEN = (32, 64, 128, 256)
# phase: (its section heading in the seed, as printed), then per batch size each row's cells for hidden 32 ... 256
_E2_TABLES = {
    "Serial": ("Serial Implementation:**", {
        32: (("53.7502", "101.854", "298.495", "641.182"), ("25.547", "48.2244", "142.924", "305.355"),
             ("28.1886", "53.6147", "155.556", "335.795"), ("0.924141", "0.913168", "0.903149", "0.883826")),
        64: (("52.4897", "102.788", "292.312", "640.129"), ("24.8217", "48.7706", "140.632", "305.177"),
             ("27.6457", "53.9888", "151.656", "334.922"), ("0.921994", "0.918177", "0.908397", "0.890983")),
        128: (("52.5417", "117.589", "294.443", "640.037"), ("24.8378", "57.6774", "141.233", "305.181"),
              ("27.689", "59.8883", "153.194", "334.829"), ("0.926527", "0.919132", "0.905773", "0.884303")),
    }),
    "Naive": ("Naive Parallel Implementation:**", {
        32: (("4.08057", "4.20267", "4.70656", "6.62628"), ("1.85931", "1.85233", "1.96686", "2.29949"),
             ("1.97359", "2.11107", "2.50106", "4.06278"), ("0.926765", "0.911498", "0.902433", "0.889313")),
        64: (("2.16029", "2.26497", "2.82669", "4.60949"), ("0.978487", "0.987802", "1.0069", "1.45947"),
             ("1.04824", "1.14375", "1.68536", "3.00794"), ("0.92605", "0.920086", "0.877604", "0.859375")),
        128: (("1.13883", "1.4589", "2.08266", "3.7738"), ("0.506824", "0.530228", "0.663619", "1.11407"),
              ("0.555735", "0.850573", "1.34303", "2.58632"), ("0.89607", "0.866951", "0.848485", "0.763494")),
    }),
    "Optimization #1": ("Parallel Optimization #1: Unified Memory Optimization:", {
        32: (("3.86961", "3.99109", "4.63106", "5.50236"), ("1.87352", "1.87325", "2.06445", "2.26276"),
             ("1.97332", "2.0951", "2.54402", "3.21667"), ("0.924141", "0.857347", "0.794609", "0.72376")),
        64: (("2.0507", "2.01787", "2.3057", "2.84771"), ("0.994761", "0.971128", "1.01114", "1.14148"),
             ("1.04451", "1.01875", "1.28303", "1.69464"), ("0.923187", "0.881629", "0.72822", "0.544508")),
        128: (("1.09844", "1.01638", "2.01367", "2.31638"), ("0.538116", "0.478708", "0.675377", "0.756874"),
              ("0.554768", "0.531796", "1.33255", "1.55173"), ("0.841856", "0.779119", "0.699337", "0.316051")),
    }),
    "Optimization #2": ("Parallel Optimization #2: Shared Memory and Tiling:", {
        32: (("3.18578", "3.14709", "3.48614", "4.1886"), ("0.842789", "0.841156", "0.909431", "0.879057"),
             ("2.04593", "2.00311", "2.26113", "3.05697"), ("0.924141", "0.912929", "0.903149", "0.88645")),
        64: (("1.43178", "1.50934", "2.01402", "3.3077"), ("0.378923", "0.39256", "0.410312", "0.583677"),
             ("0.929922", "0.986995", "1.47011", "2.58314"), ("0.927242", "0.913884", "0.886364", "0.858191")),
        128: (("0.947403", "1.01155", "1.64613", "2.89612"), ("0.240763", "0.20776", "0.288108", "0.408085"),
              ("0.612559", "0.720308", "1.27084", "2.40406"), ("0.895833", "0.877604", "0.84517", "0.776042")),
    }),
}
_E2_NOTES = {"Optimization #1": "cudaMalloc + cudaMemcpy instead of unified memory; its accuracy loss is the seed's "
                                "uninitialised buffers",
             "Optimization #2": "the seed tiled the forward GEMM only"}


def _e2_heading(heading: str) -> str:
    """'Naive Parallel Implementation:**' -> 'Naive Parallel Implementation' (the section's name)."""
    return heading.rstrip("*:")


def _e2_tables() -> tuple[PaperValue, ...]:
    entries = []
    for phase, (heading, by_batch) in _E2_TABLES.items():
        hardware = _E2_CPU if phase == "Serial" else _E2_GPU
        for batch, rows in by_batch.items():
            for (row, (quantity, unit)), cells in zip(_E2_ROWS.items(), rows):
                for hidden, text in zip(_E2_HIDDEN, cells):
                    entries.append(PaperValue(
                        source=f"{_e2_heading(heading)}, Batch size {batch}", anchor=(heading, f"Batch size {batch}"),
                        quantity=quantity, unit=unit, text=text, phase=phase, hardware=hardware, row=row,
                        column=f"{hidden} nodes", batch=batch, hidden=hidden,
                        block=None if phase == "Serial" else 1024,  # "we used a 32x32 block"
                        note=_E2_NOTES.get(phase, ""), **_E2))
    return tuple(entries)


_E2_NAIVE_TEXT = dict(source="Naive Parallel Implementation (text)",
                      anchor=("We observed a decrease in training time",), **_E2)
_SEED_002 = _e2_tables() + (
    PaperValue(quantity="speedup", unit="x", text="13", phase="Naive", versus="Serial", hardware=f"{_E2_GPU} vs "
               f"{_E2_CPU}", hidden=32, batch=32, note="'a factor of 13 for the smallest model and batch size'",
               **_E2_NAIVE_TEXT),
    PaperValue(quantity="speedup", unit="x", text="150", phase="Naive", versus="Serial", hardware=f"{_E2_GPU} vs "
               f"{_E2_CPU}", hidden=256, batch=128, note="'a factor of over 150 for the largest model with the "
                                                         "largest batch size'", **_E2_NAIVE_TEXT),
    PaperValue(quantity="time_reduction", unit="%", text="10", phase="Optimization #1", versus="Naive",
               hardware=_E2_GPU, source="Parallel Optimization #1 (text)",
               anchor=("Parallel Optimization #1", "Overall, we see a slight improvement"),
               note="'~10% performance boost'", **_E2),
    PaperValue(quantity="speedup", unit="x", text="220", phase="Optimization #2", versus="Serial",
               hardware=f"{_E2_GPU} vs {_E2_CPU}", hidden=256, batch=128, source="Parallel Optimization #2 (text)",
               anchor=("From the tiling method",), note="'a nearly 220 times speed up' for the largest model and "
                                                         "batch size", **_E2),
)

# ------------------------------------------------------------------------------------------------ seed 003 (E3)
_SEED_003 = (
    PaperValue(experiment="e3", seed=SEED_E3, source="Benchmarking Plan", anchor=("Benchmarking Plan",),
               quantity="expected_speedup", unit="x", text="5", upper_text="50", phase="GPU", versus="NumPy CPU",
               hardware="any NVIDIA GPU (a plan)", dataset="mnist", note="'Expect 5-50x speedups on large batches'"),
    PaperValue(experiment="e3", seed=SEED_E3, source="Numerical Correctness & Tests",
               anchor=("Numerical Correctness & Tests",), quantity="relative_error", unit="relative", text="1e-4",
               phase="GPU", versus="NumPy CPU", hardware="any NVIDIA GPU (a plan)", dataset="mnist",
               note="'Tolerance: relative error < 1e-4' (an upper bound)"),
)

# ------------------------------------------------------------------------------------------------ seed 001 (E4)
_E4_CPU = "cluster CPU, 4 cores (model not stated)"
_E4_GPUS = {"A40": "NVIDIA A40", "RTX 6000": "NVIDIA RTX 6000", "RTX6000": "NVIDIA RTX 6000", "V100": "NVIDIA V100"}
_E4 = dict(experiment="e4", seed=SEED_E4, n_train=60000, n_test=10000, batch=64, epochs=5)
_E4_DATASETS = {"MNIST": "mnist", "FASHION": "fashion_mnist"}
# Tables 1-2 (PyTorch): per table its dataset, then rows (device, train, test, accuracy, pin memory, workers)
_E4_PYTORCH = {
    "Table 1": ("MNIST", (
        ("CPU", "159.26", "2.93", "95.34", "-", "4"),
        ("CPU", "184.99", "3.04", "95.34", "-", "8*"),
        ("CPU", "155.17", "2.93", "95.34", "-", "2"),
        ("CUDA", "19.12", "0.66", "95.34", "True", "4"),
        ("CUDA", "19.55", "0.72", "95.34", "True", "8*"),
        ("CUDA", "25.25", "0.89", "95.34", "True", "2"),
        ("CUDA", "19.22", "0.66", "95.34", "False", "4"),
        ("CUDA", "19.90", "0.73", "95.34", "False", "8*"),
        ("CUDA", "24.97", "0.87", "95.34", "False", "2"))),
    "Table 2": ("FASHION", (
        ("CPU", "188.44", "2.95", "74.91", "-", "4"),
        ("CPU", "181.07", "3.98", "74.91", "-", "8*"),
        ("CPU", "189.96", "3.02", "74.91", "-", "2"),
        ("CUDA", "19.15", "0.66", "74.91", "True", "4"),
        ("CUDA", "19.37", "0.73", "74.91", "True", "8*"),
        ("CUDA", "24.87", "0.88", "74.91", "True", "2"),
        ("CUDA", "19.04", "0.64", "74.91", "False", "4"),
        ("CUDA", "19.71", "0.73", "74.91", "False", "8*"),
        ("CUDA", "24.84", "0.86", "74.91", "False", "2"))),
}
_E4_PYTORCH_COLUMNS = (("Training Time [s]", "train_time", "s"), ("Testing Time [s]", "test_time", "s"),
                       ("Test Accuracy", "test_accuracy", "%"))
# Tables 3-6 (the CUDA versions, block size 256): per table dataset, phase, its column labels, rows per GPU
_E4_CUDA = {
    "Table 3": ("MNIST", "naive", ("Training Time [s]", "Testing Time [s]", "Test Accuracy"), (
        ("A40", "23.47", "0.09", "97.26"),
        ("RTX 6000", "25.11", "0.10", "97.26"),
        ("V100", "41.77", "0.12", "97.26"))),
    "Table 4": ("MNIST", "optimized", ("Training Time[s]", "Testing Time[s]", "Test Accuracy"), (
        ("A40", "5.18", "0.11", "98.08"),
        ("RTX6000", "6.43", "0.13", "98.08"),
        ("V100", "8.50", "0.12", "98.08"))),
    "Table 5": ("FASHION", "naive", ("Training Time[s]", "Testing Time[s]", "Test Accuracy"), (
        ("A40", "23.45", "0.09", "87.18"),
        ("RTX6000", "25.09", "0.10", "87.18"),
        ("V100", "41.65", "0.12", "87.18"))),
    "Table 6": ("FASHION", "optimized", ("Training Time[s]", "Testing Time[s]", "Test Accuracy"), (
        ("A40", "5.17", "0.11", "87.53"),
        ("RTX6000", "6.43", "0.13", "87.53"),
        ("V100", "8.47", "0.12", "87.53"))),
}
_E4_CUDA_QUANTITIES = (("train_time", "s"), ("test_time", "s"), ("test_accuracy", "%"))
E4_CUDA_TABLES = tuple(_E4_CUDA)  # seed 001's Tables 3-6: the naive and optimized CUDA versions per dataset


def _e4_tables() -> tuple[PaperValue, ...]:
    entries = []
    for table, (name, rows) in _E4_PYTORCH.items():
        for device, *cells, pin, workers in rows:
            phase = "PyTorch CPU" if device == "CPU" else "PyTorch CUDA"
            for (column, quantity, unit), text in zip(_E4_PYTORCH_COLUMNS, cells):
                entries.append(PaperValue(
                    source=table, anchor=(f"{table}.",), caption_below=True, quantity=quantity, unit=unit, text=text,
                    phase=phase, hardware=_E4_CPU if device == "CPU" else "NVIDIA V100", dataset=_E4_DATASETS[name],
                    row=device, column=column, workers=int(workers.rstrip("*")),
                    pin_memory=None if pin == "-" else pin == "True",
                    note="PyTorch warned about too many workers (the seed's '*')" if workers.endswith("*") else "",
                    **_E4))
    for table, (name, phase, columns, rows) in _E4_CUDA.items():
        for gpu, *cells in rows:
            for column, (quantity, unit), text in zip(columns, _E4_CUDA_QUANTITIES, cells):
                entries.append(PaperValue(
                    source=table, anchor=(f"{table}.",), caption_below=True, quantity=quantity, unit=unit, text=text,
                    phase=phase, hardware=_E4_GPUS[gpu], dataset=_E4_DATASETS[name], row=gpu, column=column,
                    block=256, **_E4))  # "If not specified, it is assumed to use a 256 blocksize"
    return tuple(entries)


_E4_RTX = "NVIDIA RTX 6000"
_E4_FIGURE_1 = dict(source="4.2 Cuda results: Figure 1 (cumulative time per epoch)",
                    anchor=("The cumulative time per epoch Figure 1",), dataset="mnist",
                    note="the seed does not name Figure 1's dataset; MNIST is its default", **_E4)
E4_BLOCK_SOURCE = "4.2 Cuda results: block sizes (Figures 3-4)"
_SEED_001 = _e4_tables() + (
    PaperValue(quantity="speedup", unit="x", text="8", phase="PyTorch CUDA", versus="PyTorch CPU",
               hardware=f"NVIDIA V100 vs {_E4_CPU}", source="Abstract", anchor=("three main conclusions",),
               dataset="mnist", note="'roughly an 8x speedup' from CPU to GPU (PyTorch, Tables 1-2)", **_E4),
    PaperValue(quantity="speedup", unit="x", text="4", upper_text="5", phase="optimized", versus="naive",
               hardware="NVIDIA A40, RTX 6000 and V100", source="Abstract", anchor=("three main conclusions",),
               dataset="mnist", note="'about 4-5x' from the optimizations, across datasets and GPUs", **_E4),
    PaperValue(quantity="speedup", unit="x", text="4.5", phase="optimized", versus="naive", hardware="NVIDIA A40",
               source="4.2 Cuda results", anchor=("4.2. Cuda results", "23.47 seconds"), dataset="mnist",
               note="'a speedup of roughly 4.5x' (23.47 s -> 5.18 s on the A40)", **_E4),
    PaperValue(quantity="train_time", unit="s", text="181", phase="PyTorch CPU", hardware=_E4_CPU, **_E4_FIGURE_1),
    PaperValue(quantity="train_time", unit="s", text="25", phase="naive", hardware=_E4_RTX, **_E4_FIGURE_1),
    PaperValue(quantity="train_time", unit="s", text="6.5", phase="optimized", hardware=_E4_RTX, **_E4_FIGURE_1),
    PaperValue(quantity="speedup", unit="x", text="4", phase="optimized", versus="naive", hardware=_E4_RTX,
               **_E4_FIGURE_1),
    PaperValue(quantity="speedup", unit="x", text="28", phase="optimized", versus="PyTorch CPU",
               hardware=f"{_E4_RTX} vs {_E4_CPU}", **_E4_FIGURE_1),
    PaperValue(quantity="train_loss", unit="CE", text="2.303", phase="naive", hardware=_E4_RTX, block=1024,
               source=E4_BLOCK_SOURCE, anchor=("At a block size of 1024",), dataset="mnist",
               note="block 1024 'fails entirely': the loss stays at ln 10; the dataset is not named (MNIST, its "
                    "default); 128 and 256 train best, 512 slower and slightly worse", **_E4),
)

# ------------------------------------------------------------------------------------------------ seed 004 (E5, E6)
_E5_CPU = "single CPU core (model not stated)"
_E5_GPU = "NVIDIA T4 (Colab, CUDA arch 75; the seed names no GPU)"
_E5 = dict(experiment="e5", seed=SEED_E5, dataset="cifar10", n_test=10000, batch=1, epochs=20)
_E5_HW = {"CPU": _E5_CPU, "GPU naive": _E5_GPU, "GPU optimized v1": _E5_GPU, "GPU optimized v2": _E5_GPU}
E5_EPOCH_TABLE = "Phase 2.4: Performance Comparison Table"  # every phase's epoch time over 50 000 images
# the section 2.2 / 2.3 / 2.4 tables: (source, anchor, header of the last column, its versus phase, rows):
# rows are (label as printed, phase, epoch time, speedup vs CPU, last column; None: '-' or not a number)
_E5_PHASE_TABLES = (
    ("Phase 2.2: Performance Comparison", ("Phase 2.2", "Performance Comparison"), None, None, (
        ("CPU (Extrapolated)", "CPU", "29,678.00", "1.0", None),
        ("GPU Naive", "GPU naive", "991.63", "29.93", None))),
    ("Phase 2.3: Performance Comparison Table", ("Phase 2.3", "Performance Comparison Table"), "Speedup (vs. Naive)",
     "GPU naive", (
         ("CPU (Extrapolated)", "CPU", "29,678.00", "1.0", None),
         ("GPU Naive (Phase 2.2)", "GPU naive", "991.63", "29.93", "1.0"),
         ("GPU Optimized v1 (2.3)", "GPU optimized v1", "517.18", "57.39", "1.92"))),
    (E5_EPOCH_TABLE, ("Phase 2.4", "Performance Comparison Table"), "Speedup (vs. Prev Phase)", "previous", (
        ("CPU (Extrapolated)", "CPU", "29,678.00", "1.0", None),
        ("GPU Naive (2.2)", "GPU naive", "991.63", "29.93", "29.93"),
        ("GPU Optimized v1 (2.3)", "GPU optimized v1", "517.18", "57.39", "1.92"),
        ("GPU Optimized v2 (2.4)", "GPU optimized v2", "117.97", "251.57", "4.38"))),
)
# section 3.1: (label, phase, training time for 20 epochs, speedup vs CPU, incremental speedup, RAM MiB, VRAM MiB)
E5_TOTAL_TABLE = "3.1 Performance Comparison Across All Phases"
_E5_TOTALS = (("CPU Baseline", "CPU", "593,560.0", "1.00", None, "710", None),
              ("GPU Naive", "GPU naive", "19,832.6", "29.93", "29.93", "1024", "116"),
              ("GPU Optimized v1", "GPU optimized v1", "10,343.6", "57.39", "1.92", "799", "90"),
              ("GPU Optimized v2", "GPU optimized v2", "2,359.4", "251.57", "4.38", "799", "88"))
_E5_ORDER = ("CPU", "GPU naive", "GPU optimized v1", "GPU optimized v2")


def _e5_tables() -> tuple[PaperValue, ...]:
    entries = []
    for source, anchor, last_column, last_versus, rows in _E5_PHASE_TABLES:
        time_column = "Avg. Epoch Time (s)" if source.startswith("Phase 2.2") else "Epoch Time (s)"
        speedup_column = "Speedup" if source.startswith("Phase 2.2") else "Speedup (vs. CPU)"
        for label, phase, epoch_s, speedup, last in rows:
            cell = dict(source=source, anchor=anchor, phase=phase, hardware=_E5_HW[phase], row=label, n_train=50000,
                        **_E5)
            extrapolated = "the CPU's 1 000-image epoch x 50" if phase == "CPU" else ""
            entries.append(PaperValue(quantity="epoch_time", unit="s", text=epoch_s, column=time_column,
                                      note=extrapolated, **cell))
            entries.append(PaperValue(quantity="speedup", unit="x", text=speedup, column=speedup_column, versus="CPU",
                                      **cell))
            if last is not None:
                versus = _E5_ORDER[_E5_ORDER.index(phase) - 1] if last_versus == "previous" else last_versus
                entries.append(PaperValue(quantity="speedup", unit="x", text=last, column=last_column, versus=versus,
                                          **cell))
    for label, phase, total_s, speedup, incremental, ram, vram in _E5_TOTALS:
        cell = dict(source=E5_TOTAL_TABLE, anchor=(E5_TOTAL_TABLE,), phase=phase, hardware=_E5_HW[phase], row=label,
                    n_train=50000, **_E5)
        entries.append(PaperValue(quantity="train_time", unit="s", text=total_s, column="Training Time (s)",
                                  note="extrapolated from 1 000 images" if phase == "CPU" else "", **cell))
        entries.append(PaperValue(quantity="speedup", unit="x", text=speedup, column="Speedup (vs CPU)", versus="CPU",
                                  **cell))
        if incremental is not None:
            entries.append(PaperValue(quantity="speedup", unit="x", text=incremental, column="Incremental Speedup",
                                      versus=_E5_ORDER[_E5_ORDER.index(phase) - 1], **cell))
        entries.append(PaperValue(quantity="host_memory", unit="MiB", text=ram, column="Memory (RAM/VRAM)", **cell))
        if vram is not None:
            entries.append(PaperValue(quantity="gpu_memory", unit="MiB", text=vram, column="Memory (RAM/VRAM)", **cell))
    return tuple(entries)


_E5_CPU_RESULTS = dict(source="Phase 2.1: CPU Baseline, Results", anchor=("Phase 2.1", "Results"), phase="CPU",
                       hardware=_E5_CPU, n_train=1000, **_E5)
_E5_GPU_MSE = dict(source="Phase 2.2: Reconstruction Quality", anchor=("Phase 2.2", "Reconstruction Quality"),
                   phase="GPU naive", hardware=_E5_GPU, n_train=50000, **_E5)
_E6 = dict(experiment="e6", seed=SEED_E5, phase="cuML SVC", hardware="GPU through cuML on Kaggle (model not stated)",
           dataset="cifar10 encoder features (8192)", n_train=50000, n_test=10000)
_E6_RESULTS = dict(source="Phase 2.5: SVM Integration, Results", anchor=("Phase 2.5", "SVM training time"), **_E6)
_SEED_004 = _e5_tables() + (
    PaperValue(quantity="train_mse", unit="MSE", text="0.01", note="'Training MSE loss ≈ 0.01'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="test_mse", unit="MSE", text="0.01", note="'Test MSE loss ≈ 0.01'", **_E5_CPU_RESULTS),
    PaperValue(quantity="block_time", unit="s", text="59.35", note="'Average 100-image block time'", **_E5_CPU_RESULTS),
    PaperValue(quantity="epoch_time", unit="s", text="593.5", note="'Total epoch time (1,000 images)'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="train_time", unit="s", text="11,870", note="'Total training time (20 epochs)'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="train_time", unit="h", text="3.3", note="'approx. 3.3 hours'", **_E5_CPU_RESULTS),
    PaperValue(quantity="parameters", unit="count", text="751,875", note="'Total parameters: ~751,875'",
               **_E5_CPU_RESULTS),
    PaperValue(quantity="train_mse", unit="MSE", text="0.011", source="Phase 2.1: CPU Baseline, MSE Graph",
               anchor=("Phase 2.1", "MSE Graph"), note="'plateaus at a higher loss of approximately 0.011'",
               **{k: v for k, v in _E5_CPU_RESULTS.items() if k not in ("source", "anchor")}),
    PaperValue(quantity="train_time", unit="days", text="68", source="Phase 2.1: CPU Baseline, Results",
               anchor=("Phase 2.1", "Extrapolation"), phase="CPU", hardware=_E5_CPU, n_train=50000,
               note="an extrapolation to 50 000 images and 200 epochs",
               **{k: v for k, v in _E5.items() if k != "epochs"}, epochs=200),
    PaperValue(quantity="epoch_time", unit="s", text="593.56", source="Phase 2.2: CPU Time Extrapolation",
               anchor=("Phase 2.2", "CPU Time Extrapolation"), phase="CPU", hardware=_E5_CPU, n_train=1000, **_E5),
    PaperValue(quantity="train_mse", unit="MSE", text="0.01", epoch=1, note="'Stabilized at ~0.01 on the first epoch'",
               **_E5_GPU_MSE),
    PaperValue(quantity="train_mse", unit="MSE", text="0.045", epoch=20,
               note="'converge to 0.045 after 20th epochs': the same section then says 'a final loss of roughly "
                    "0.0045' (a typo one way or the other)", **_E5_GPU_MSE),
    PaperValue(quantity="train_mse", unit="MSE", text="0.0045", epoch=20, note="'a final loss of roughly 0.0045', "
               "the same for every GPU variant", **_E5_GPU_MSE),
    PaperValue(quantity="time_reduction", unit="%", text="66", phase="GPU naive", versus="CPU", hardware=_E5_GPU,
               source="Phase 2.2: Key Takeaways", anchor=("Phase 2.2", "Parallelism Wins"), n_train=50000,
               note="'reduced training time by 66%': its own table's 29.93x is a 96.7 % reduction", **_E5),
    PaperValue(quantity="expected_speedup", unit="x", text="20", phase="GPU optimized v2", versus="CPU",
               hardware=f"{_E5_GPU} vs {_E5_CPU}", source="4. Project Objectives", anchor=("4. Project Objectives",),
               n_train=50000, note="a target: '> 20x'", **_E5),
    PaperValue(quantity="train_time", unit="h", text="165", phase="CPU", hardware=_E5_CPU,
               source="3.2 Visualizations & Impact Analysis", anchor=("3.2 Visualizations",), n_train=50000,
               note="estimated ('from an estimated 165 hours')", **_E5),
    PaperValue(quantity="train_time", unit="min", text="40", phase="GPU optimized v2", hardware=_E5_GPU,
               source="3.2 Visualizations & Impact Analysis", anchor=("3.2 Visualizations",), n_train=50000,
               note="'just under 40 minutes'", **_E5),
    PaperValue(quantity="speedup", unit="x", text="251.55", phase="GPU optimized v2", versus="CPU",
               hardware=f"{_E5_GPU} vs {_E5_CPU}", source="5.2 Key Achievements", anchor=("5.2 Key Achievements",),
               n_train=50000, note="from '593,500 s vs 2,359.4 s' (section 3.1 prints 593,560.0 s and 251.57x)", **_E5),
    PaperValue(quantity="train_time", unit="s", text="593,500", phase="CPU", hardware=_E5_CPU,
               source="5.2 Key Achievements", anchor=("5.2 Key Achievements",), n_train=50000,
               note="section 3.1 prints 593,560.0 s for the same time", **_E5),
    PaperValue(quantity="memory_reduction", unit="%", text="22", phase="GPU optimized v2", versus="GPU naive",
               hardware=_E5_GPU, source="5.2 Key Achievements", anchor=("5.2 Key Achievements",), n_train=50000,
               note="system RAM (1024 -> 799 MiB)", **_E5),
    PaperValue(quantity="fit_time", unit="s", text="46", note="'SVM training time: ~46 seconds'", **_E6_RESULTS),
    PaperValue(quantity="train_accuracy", unit="%", text="86.03", **_E6_RESULTS),
    PaperValue(quantity="test_accuracy", unit="%", text="67.56", **_E6_RESULTS),
    PaperValue(quantity="expected_accuracy", unit="%", text="60", upper_text="65", source="Phase 2.5: SVM Integration, "
               "Analysis", anchor=("Phase 2.5", "expected range"), note="the test accuracy it expected", **_E6),
)

PAPER_VALUES: tuple[PaperValue, ...] = _SEED_000 + _SEED_002 + _SEED_003 + _SEED_001 + _SEED_004


# ------------------------------------------------------------------------------------------------ queries
def paper_values(experiment: str | None = None, quantity: str | None = None, **fields) -> tuple[PaperValue, ...]:
    """The entries of `experiment` (e1 ... e6; None: all) measuring `quantity` (None: any) whose other fields equal
    `fields` (e.g. phase='GPU naive', source=..., unit='s', batch=64), in the order of the seeds."""
    unknown = [name for name in fields if name not in PaperValue.__dataclass_fields__]
    if unknown:
        raise GpunnError(f"paper_values: no field {', '.join(unknown)}; the fields are "
                         f"{', '.join(PaperValue.__dataclass_fields__)}")
    return tuple(entry for entry in PAPER_VALUES
                 if (experiment is None or entry.experiment == experiment)
                 and (quantity is None or entry.quantity == quantity)
                 and all(getattr(entry, name) == want for name, want in fields.items()))


def paper_value(experiment: str, quantity: str, **fields) -> PaperValue:
    """The one entry paper_values selects; a GpunnError naming the selection when there are none or several."""
    found = paper_values(experiment, quantity, **fields)
    if len(found) != 1:
        where = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        raise GpunnError(f"papers: {len(found)} values of {experiment} {quantity} with {where or 'no filter'}; "
                         "expected one")
    return found[0]


def column_labels(seed: str, source: str) -> tuple[str, ...]:
    """The column labels of a seed table, as printed, in the order of its entries."""
    return tuple(dict.fromkeys(e.column for e in PAPER_VALUES if e.seed == seed and e.source == source and e.column))


def phase_of(seed: str, variant: str) -> str | None:
    """The paper's phase that `variant` reproduces first (PHASES), None if none."""
    return next((phase for phase, ours in PHASES[seed].items() if ours[:1] == (variant,)), None)
