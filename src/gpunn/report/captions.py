"""Captions of the report's figures: what each one shows and which figure (or table, or section) of its seed it
mirrors. One source for the entry page (gpunn.report.index puts each caption under its figure's link) and for
`snakemake --report` (one reStructuredText caption file per figure under workflow/report/captions/, generated
from here by `python -m gpunn captions`; tests/test_captions.py checks that they are in sync).

The seeds are ../shared/seeds (gpunn.report.papers names them): 000 (E1), 002 (E2), 003 (E3), 001 (E4), 004 (E5,
E6). Where a seed has no figure of its own, `mirrors` says what of the seed the figure draws instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpunn.errors import GpunnError


@dataclass(frozen=True)
class Caption:
    shows: str    # what the figure shows, in a sentence or two
    mirrors: str  # which seed figure, table or section it regenerates, and how it differs
    seed: str     # short: "seed 001 Figure 1", "seed 002 tables", for the report's label column

    def text(self) -> str:
        return f"{self.shows} Mirrors {self.mirrors}."


# E1's, E4's and E5's step_profile.png (gpunn.report.step_profile) show the same thing for their models
STEP_PROFILE_SHOWS = (
    "Where one training step of each GPU variant spends its time, at the experiment's sizes and batch: a bar per "
    "variant, its kernels' GPU time stacked by kernel (small ones merged into 'other'; each launch timed alone, "
    "queued behind a GPU sleep, the median of repeats) and the host overhead on top (the step's wall time as the "
    "training loop runs it minus the kernels' sum: host work, batch copies and synchronisations); beside it the "
    "same as shares of the step (a negative host overhead, drawn as none: the kernels ran back to back faster than "
    "their sum timed alone, each of which carries about 2 us of event overhead). Under the CUDA simulator: each "
    "kernel's launches counted, no times.")

# Figures whose name carries a dataset ('samples_mnist.png') are captioned under their prefix + '*'.
CAPTIONS: dict[tuple[str, str], Caption] = {
    ("e1", "loss_curves.png"): Caption(
        "Train and test loss (and test accuracy) per epoch of every E1 run, one line per variant and loss reduction.",
        "seed 000's training convergence (section 2.5), which it states as text: CPU loss 0.2257 -> 0.0045, GPU "
        "0.8420 -> 0.2218 over 10 epochs", "seed 000 section 2.5"),
    ("e1", "epoch_time.png"): Caption(
        "Time per epoch of each variant, on a log axis.",
        "seed 000's 'Avg. time per epoch' row (section 2.5, Measured Performance: CPU 29.86 s, T4 0.225 s)",
        "seed 000 section 2.5 table"),
    ("e1", "samples.png"): Caption(
        "Test images with the predicted and the true class, wrong predictions in red, from the reference variant.",
        "seed 003's planned 'sample classifications' (seed 000 has no such figure)", "seed 003 plan"),
    ("e1", "reduction_gap.png"): Caption(
        "Train loss per epoch of the CPU baseline and of a GPU variant, each trained with the batch-mean and with "
        "the batch-sum gradient, beside seed 000's CPU and GPU losses (markers): which reduction each of the "
        "seed's trajectories follows, and so where its 4-point CPU-GPU accuracy gap comes from.",
        "seed 000's loss trajectories and accuracy gap (sections 2.5 and 3.5), stated as text there",
        "seed 000 sections 2.5, 3.5"),
    ("e1", "step_profile.png"): Caption(
        STEP_PROFILE_SHOWS,
        "seed 003's planned profiling snapshots (seed 000 has no profile)", "seed 003 plan"),
    ("e2", "heatmaps.png"): Caption(
        "Training time (log colour scale) and test accuracy over hidden size x batch size, one panel per variant.",
        "seed 002's tables, one per implementation and batch size, of training time and test accuracy per hidden "
        "size", "seed 002 tables"),
    ("e2", "forward_backward.png"): Caption(
        "Training, forward and backward time summed over training against hidden size, one column of panels per "
        "batch size, one line per variant, log axes shared by all panels.",
        "seed 002's 'Training time', 'Forward propagation time' and 'Backpropagation time' rows across its hidden "
        "sizes, drawn as lines", "seed 002 tables"),
    ("e3", "batch_timing.png"): Caption(
        "The MLP's training step against batch size, one line per variant, log axes. Throughput (top left, top "
        "middle): steps run back to back as the training loop runs them, through the variant's own data path (its "
        "per-step batch copies, or its data resident on the GPU), as samples per second and as an epoch's wall time "
        "over its steps. Latency (top right): the wall time of one synchronous training step called from Python on "
        "a host batch: the copy, the launches and the wait for the GPU. Split (bottom): the forward pass with the "
        "loss, and the backward pass with the update, per step of the throughput epochs: GPU time from CUDA events "
        "around each phase for the GPU variants (the batch copy excluded), the host clock for the CPU variants and "
        "under numba's simulator (panel titles name the clock).",
        "seed 003's benchmarking plan (batch sizes 1 to 512, custom kernels against a NumPy CPU baseline), which "
        "has no figure", "seed 003 plan"),
    ("e3", "block_sweep.png"): Caption(
        "Kernel time against threads per block, one line per op, one panel per matrix shape.",
        "seed 003's planned block-size sweep, which has no figure", "seed 003 plan"),
    ("e4", "cumulative_time.png"): Caption(
        "Cumulative training time after each epoch, one panel per dataset, one line per variant.",
        "seed 001's Figure 1 (cumulative time per epoch on an RTX 6000)", "seed 001 Figure 1"),
    ("e4", "loss_curves.png"): Caption(
        "Average train loss and test accuracy per epoch, one panel per dataset, one line per variant.",
        "seed 001's Figure 2 (average loss per epoch on an RTX 6000)", "seed 001 Figure 2"),
    ("e4", "samples_*.png"): Caption(
        "Test images of one dataset with the predicted and the true class, wrong predictions in red.",
        "seed 003's planned sample classifications (seed 001 has no such figure)", "seed 003 plan"),
    ("e4", "block_time.png"): Caption(
        "Cumulative training time per epoch for each threads-per-block setting, one panel per variant.",
        "seed 001's Figure 3 (cumulative training time per epoch for different block sizes, naive implementation)",
        "seed 001 Figure 3"),
    ("e4", "block_loss.png"): Caption(
        "Average train loss per epoch for each threads-per-block setting, one panel per variant.",
        "seed 001's Figure 4 (average loss per epoch for different block sizes, naive implementation)",
        "seed 001 Figure 4"),
    ("e4", "step_profile.png"): Caption(
        STEP_PROFILE_SHOWS,
        "seed 003's planned profiling snapshots (seed 001 has no profile)", "seed 003 plan"),
    ("e5", "mse_curves.png"): Caption(
        "Train and test MSE per epoch of each variant (the legend gives each one's training-set size).",
        "seed 004's MSE graph (Phase 2.1: the CPU on 1 000 images) and its GPU convergence text",
        "seed 004 Phase 2.1"),
    ("e5", "reconstructions.png"): Caption(
        "The first test image of each class (top) above the autoencoder's reconstruction of it (bottom).",
        "seed 004's Original / Reconstructed images (Phase 2.2)", "seed 004 Phase 2.2"),
    ("e5", "training_time.png"): Caption(
        "Training time for all epochs over 50 000 images per variant, log axis; bars extrapolated from a subset or "
        "from fewer epochs are cross-hatched.",
        "seed 004's 'Total Training Time (Log Scale)' (section 3.2)", "seed 004 section 3.2"),
    ("e5", "speedup.png"): Caption(
        "Speedup of each variant over cpu-numpy per 50 000-image epoch, log axis.",
        "seed 004's 'Cumulative Speedup Analysis' (section 3.2)", "seed 004 section 3.2"),
    ("e5", "step_profile.png"): Caption(
        STEP_PROFILE_SHOWS,
        "seed 004's 'Profiling Analysis' kernel breakdowns of Phases 2.2-2.4 (e.g. its naive conv weight gradient at "
        "84.4 % of the kernel time), as a bar per variant", "seed 004 Phases 2.2-2.4 profiles"),
    ("e6", "confusion.png"): Caption(
        "Confusion matrix of the RBF SVM on the encoder's features of the test set: rows are true classes, columns "
        "predicted ones, cells are counts.",
        "seed 004's SVM results (Phase 2.5), which give accuracies only; the matrix shows where they come from",
        "seed 004 Phase 2.5"),
}


def caption_key(experiment: str, figure: str) -> tuple[str, str]:
    """The CAPTIONS key of a figure file name; a GpunnError naming the figure when it has no caption."""
    if (experiment, figure) in CAPTIONS:
        return experiment, figure
    prefix = figure.split("_", 1)[0] + "_*.png"
    if "_" in figure and (experiment, prefix) in CAPTIONS:
        return experiment, prefix
    raise GpunnError(f"no caption for {experiment} figure '{figure}': add one to gpunn.report.captions.CAPTIONS")


def caption(experiment: str, figure: str) -> Caption:
    """The caption of one report figure (by file name, PNG)."""
    return CAPTIONS[caption_key(experiment, figure)]


def rst_name(experiment: str, figure: str) -> str:
    """The caption file of a figure under workflow/report/captions/: 'e4_samples.rst' for samples_mnist.png."""
    _, name = caption_key(experiment, figure)
    return f"{experiment}_{name.replace('_*', '').removesuffix('.png')}.rst"


def rst_text(experiment: str, figure: str) -> str:
    found = caption(experiment, figure)
    return (f"{found.shows}\n\n*Mirrors* {found.mirrors}.\n\nThe experiment's tables, and this figure as PDF, are "
            f"in its report folder, ``<results_dir>/report/<machine>/{experiment}/``; the entry page is "
            f"``index.md`` beside it.\n")


def write_rst(out_dir) -> list[Path]:
    """Write every caption's reStructuredText file into `out_dir` (workflow/report/captions); returns them."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for experiment, figure in CAPTIONS:
        path = out_dir / rst_name(experiment, figure)
        path.write_text(rst_text(experiment, figure))
        written.append(path)
    return written
