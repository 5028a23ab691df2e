"""GPU variants as data: which kernel version per layer type, which fusions, resident data or per-step copies,
CUDA graphs or not. The engine (gpunn.backends.gpu.engine) reads nothing else to decide how to train.

    gpu-naive  E1's design: batch copied to the GPU every step, one kernel per op (naive GEMMs, bias add,
               ReLU, softmax-CE gradient, atomicAdd column sums for bias gradients, SGD); the step's loss is
               copied back every step
    gpu-tiled  the same with 16x16 shared-memory tiled GEMMs in the forward AND backward pass
    gpu-fused  fewest launches, nothing per step on the host: the training set lives on the GPU and each step
               gathers its batch there from the epoch's order and a device-side step counter; a Linear layer fed
               by the gather or by another Linear folds its bias into the GEMM (a ones column after its input,
               the bias row stored right after W in the flat buffer: the bias gradient falls out of the weight-
               gradient GEMM, deterministic), ReLU is the producing GEMM's epilogue and its backward the mask
               epilogue of the next layer's input-gradient GEMM; one SGD launch updates every parameter and
               advances the counter (the MLP: 8 launches per step). Per-sample losses accumulate in an epoch-long
               device buffer read once per epoch.
    gpu-graph  the fastest step: gpu-fused's design, the MLP's whole step as the persistent step (`step`:
               gpunn.kernels.mlp_step, a cooperative forward launch and a backward launch that applies the SGD
               update and advances the counter), each convolution pass in its fastest deterministic version for the
               layer's shape (conv "auto": conv_version), a resident epoch's launches captured once into one CUDA
               graph and replayed (`graph_epoch`; real GPU only: the simulator has no graphs); a final Linear under the
               softmax-CE loss, outside the persistent step, fused with its head (`head: fused`: two launches)
    gpu-tf32   gpu-graph on the tensor cores (`precision`, all three models): every GEMM and Conv2d pass at least
    gpu-bf16   TENSOR_MIN_SIDE on each GEMM side multiplies inputs rounded to TF32 or BF16 with float32
               accumulation (gpunn.kernels.gemm.tensor, Winograd's batched GEMMs included); smaller products, the
               bias gradients, weights, update, loss and softmax in float32; the MLP's step per layer

The CNN's variants (paper 001's naive and optimized CUDA versions, and ours):

    gpu-naive      (shared with the MLP) one thread per output element in every kernel: direct convolutions (a
                   layer's weight and bias gradients in one launch, as the paper's ConvLayerBackward), a separate
                   ReLU kernel, max-pool backward with atomics, naive GEMM for the FC layer; the batch
                   copied host->device every step, the loss read back every step, one SGD launch per layer
                   (conv1, conv2, fc: the paper's SGDBackward per parameter set)
    gpu-optimized  the paper's optimized list, each a field here: conv+ReLU fused (`fuse`), shared-memory input
                   tiles (conv `tiled`), tiled FC GEMM (`gemm: tiled16`), warp-shuffle weight-gradient reductions
                   (conv backward_weight `shuffle`), pinned host buffers with a copy stream so the next batch's copy
                   overlaps this step's compute, three buffers deep (`copy: pipelined`), one SGD launch over the
                   flat buffer (`sgd: flat`); the per-sample losses stay on the GPU until the epoch ends
    gpu-im2col     every convolution pass an implicit-im2col GEMM on the register-blocked family, the training set
                   resident on the GPU, deterministic reductions only (fixed-order split-K and split bias-gradient
                   sums, race-free gather max-pool backward): two runs give the same bits

The autoencoder's variants (paper 004's three conv implementations, and ours), all one image or one mini-batch
per step (RunSpec.batch; batch 1 is the paper's setting):

    gpu-naive      (shared) direct convolutions, one thread per output element, atomic max-pool backward
    gpu-tiled      the paper's "optimized v1": shared-memory input tiles for the forward and backward-data passes,
                   block-reduction weight and bias gradients (TILED_CONV), unfused ReLU, 16x16 tiled GEMMs
    gpu-im2col     the paper's "optimized v2": every conv pass an implicit-im2col GEMM, data resident
    gpu-graph      the fastest: conv "auto" per layer shape, each Upsample fused into the Conv2d after it
                   (`upsample: fused`: the conv's passes read the small map through the upsample, its backward-data
                   one stride-2 GEMM on the small map), captured in CUDA graphs

Conv2d + ReLU + MaxPool2d(2) runs (`pool`, pool_fused): gpu-im2col and gpu-graph fuse the CNN's conv2 and the
autoencoder's conv1, each with its ReLU and pool, into one stage whose forward writes only the pooled output and the
winners' route, and whose backward reads the pooled gradient through the route (gpunn.kernels.conv.pooled); the other
variants keep separate stages. gpu-graph runs that stage's forward and input gradient as direct convolutions from
shared memory where they fit (`pool_conv`, gpunn.kernels.conv.direct_pooled), gpu-im2col as GEMMs. gpu-graph,
gpu-tf32 and gpu-bf16 also fuse the autoencoder's conv2 (256 -> 128, Winograd) with its ReLU and pool: one stage on
Winograd's pooled passes (pool_winograd, gpunn.kernels.conv.winograd_pool; AUTO_POOL_WINOGRAD).

A run's block size (RunSpec.block, `_t<threads>` in its path) reaches the kernels that take a thread count
(`with_block`): every kernel of gpu-naive; the tiled and shuffle convolutions, the pool, bias, elementwise and SGD
kernels of gpu-optimized (its 16x16 GEMM tile is fixed). The register-blocked GEMMs run a fixed block, so the
resident variants take none (the registry's `blocks` fact).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Policy:
    name: str
    gemm: str          # GEMM version (gpunn.kernels.gemm.DENSE_LAUNCHERS) of dense layers, or "auto": regblock
                       # (64x64 tiles) when the output fills at least AUTO_MIN_BLOCKS of its blocks, else tiled16;
                       # split-K where few tiles loop over a long K (gemm_splits)
    fuse: bool         # bias + ReLU in epilogues, ReLU backward as a mask, folded biases, tree bias gradients
    resident: bool     # training set on the GPU, batch gathered there by a device-side step counter
    graphs: bool = False  # each step's launches captured in CUDA graphs (needs a real GPU)
    graph_epoch: bool = False  # with graphs and resident data: an epoch's steps all in one graph, the clock's marks
                               # event nodes in it, one launch an epoch (graphs.py); else two graph launches a step
    ce_block: int = 32    # threads per row of the softmax-CE head (a warp: the classifiers have 10 classes)
    # convolution version per pass (gpunn.kernels.conv.VERSIONS) and the max-pool backward (pool.OPS)
    conv: dict = field(default_factory=lambda: dict(DIRECT_CONV))
    pool_backward: str = "atomic"
    sgd: str = "flat"     # "flat": one SGD launch over the flat buffer; "per_layer": one launch per layer's parameters
    copy: str = "sync"    # per-step policies: "sync" copies each host batch before its step (and reads the loss back);
                          # "pipelined": pinned host buffers, PIPELINE_DEPTH deep, copied on a stream of their own
                          # while the previous step computes; losses stay on the GPU until the epoch ends
    blocks: bool = False  # a run's block size (threads per block) reaches the kernels that take one
    block: int = 0        # that block size (0: every kernel's own default)
    upsample: str = "separate"  # an Upsample followed by a Conv2d: "separate" kernels (the upsampled map written,
                                # then read by the conv), or "fused": the conv's passes read through the upsample
                                # (gpunn.kernels.conv.UP_VERSIONS; the upsample's launches and its map disappear)
    pool: str = "separate"  # Conv2d + ReLU + MaxPool2d: "separate" stages; "fused" one stage (gpunn.kernels.conv.
                            # pooled: the conv's full-size output and gradient never stored); "auto" fused where
                            # the window tiles suit the conv: few output channels or a shallow K, or where the conv
                            # runs Winograd (its pooled passes: pool_winograd) (pool_fused)
    # the fused stage's forward and input gradient, per pass: "gemm" (pooled's implicit GEMMs) or "direct"
    # (gpunn.kernels.conv.direct_pooled: direct convolutions from shared memory where direct_fits; else the GEMMs)
    pool_conv: dict = field(default_factory=lambda: dict(POOL_GEMM))
    step: str = "layers"  # "layers": one stage per layer op (layers.py); "persistent": a resident MLP's whole
                          # step (Linear, ReLU, Linear, softmax-CE) in two launches, its forward one cooperative
                          # launch with a grid-wide sync (gpunn.backends.gpu.persistent; other models keep the
                          # stages); "phased": that step's device code in three plain launches (nothing cooperative)
    head: str = "layers"  # a final Linear under the softmax_ce loss: "layers", its stage then the loss head (GEMMs,
                          # softmax_ce_grad, column sums: six launches); "fused", one stage whose forward launch is
                          # the loss head too and whose backward is one launch (gpunn.kernels.linear_head; head_fused)
    precision: str = "fp32"  # "fp32"; or "tf32" / "bf16": every product that fills the tensor cores' tiles
                             # (tensor_pass: at least TENSOR_MIN_SIDE on each GEMM side) multiplies there, its
                             # inputs rounded to that format, float32 accumulation (precision_gemm); the smaller
                             # products keep their float32 kernels; weights, their update, the loss and softmax stay
                             # float32. Needs step "layers" (the persistent MLP step is float32 throughout)

    def __post_init__(self):
        for name, value, choices in (("sgd", self.sgd, SGD_MODES), ("copy", self.copy, COPY_MODES),
                                     ("upsample", self.upsample, UPSAMPLE_MODES), ("pool", self.pool, POOL_MODES),
                                     ("step", self.step, STEP_MODES), ("head", self.head, HEAD_MODES)):
            if value not in choices:
                raise ValueError(f"policy {self.name}: {name} must be one of {choices}, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"policy {self.name}: precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision != "fp32" and self.step != "layers":
            raise ValueError(f"policy {self.name}: precision {self.precision!r} needs step 'layers' (the persistent "
                             f"step's products are float32)")
        if sorted(self.pool_conv) != sorted(POOL_GEMM) or not set(self.pool_conv.values()) <= set(POOL_CONV_MODES):
            raise ValueError(f"policy {self.name}: pool_conv must map {tuple(POOL_GEMM)} to one of {POOL_CONV_MODES}, "
                             f"got {self.pool_conv!r}")

    @property
    def simulator(self) -> bool:
        """Whether numba's CUDA simulator can run this policy (it has no CUDA graphs)."""
        return not self.graphs

    @property
    def deterministic(self) -> bool:
        """Whether two runs give the same bits: no kernel it may launch adds floats in a racing order. Those that
        do: the unfused Linear's bias gradient (atomic column sums, `fuse` False) and the block-reduction weight
        gradients that split the batch (ATOMIC_WGRAD: their splits add into dw). The atomic max-pool backward
        does not race (its windows never share an input element)."""
        return self.fuse and self.conv["backward_weight"] not in ATOMIC_WGRAD

    def with_block(self, block: int) -> Policy:
        """This policy with every kernel that takes a thread count launched with `block` threads (0: defaults)."""
        return replace(self, block=int(block))

    def for_simulator(self) -> Policy:
        """What runs under numba's CUDA simulator, which has no warp shuffles and runs every thread of a block as
        a Python thread: each conv version that needs shuffles replaced by its SIMULATOR_TWIN (the same
        decomposition reduced through shared memory), and the kernels that take a thread count launched with
        SIMULATOR_THREADS unless the run chose a block size (grid-stride and tree kernels compute the same sums
        with fewer threads, at a fraction of the simulator's cost; the GPU tests run the default blocks)."""
        conv = {step: SIMULATOR_TWIN.get(name, name) for step, name in self.conv.items()}
        return replace(self, conv=conv, block=self.block or SIMULATOR_THREADS)

    def kw(self) -> dict:
        """Launcher keyword arguments for a kernel that takes a thread count (nothing: its default)."""
        return {"block": self.block} if self.block else {}


# the bias gradient "made by the weight-gradient pass" (no launch of its own), a bias_grad version (see below)
BIAS_WITH_WEIGHT = "with_weight"
# paper 001's naive: one thread per output element, a layer's weight and bias gradients in one launch (its
# ConvLayerBackward: one thread per weight and one per bias channel; gpunn.kernels.conv.naive)
DIRECT_CONV = {"forward": "naive", "backward_data": "naive", "backward_weight": "naive",
               "bias_grad": BIAS_WITH_WEIGHT}
TILED_CONV = {"forward": "tiled", "backward_data": "tiled", "backward_weight": "block", "bias_grad": "block"}
# the fused policies' conv: every pass an implicit-im2col GEMM (bias + ReLU, and the ReLU mask, in its epilogue)
FUSED_CONV = {"forward": "implicit_gemm", "backward_data": "implicit_gemm", "backward_weight": "implicit_gemm",
              "bias_grad": "split"}
# the paper's optimized CNN: shared-memory input tiles with bias + ReLU fused, warp-shuffle weight gradients
OPTIMIZED_CONV = {"forward": "tiled", "backward_data": "tiled", "backward_weight": "shuffle", "bias_grad": "block"}
# weight-gradient versions whose threads add into dw with atomics (weight_grad's batch splits; wgrad_atomic)
ATOMIC_WGRAD = ("block", "shuffle", "atomic")
# conv versions needing a real GPU (warp shuffles) -> the simulator's stand-in with the same block decomposition
SIMULATOR_TWIN = {"shuffle": "block"}
SIMULATOR_THREADS = 32  # the simulator's block for thread-count kernels when a run sets none (for_simulator)
AUTO_MIN_BLOCKS = 8  # below this many 64x64 output tiles the 16x16 tiles keep more SMs busy
# "auto" conv versions (conv_version): per-shape rules read off the H100 conv benchmark
AUTO_CONV = {"forward": "auto", "backward_data": "auto", "backward_weight": "auto", "bias_grad": "auto"}
AUTO_TILED_MAX_PRODUCT = 4096  # in x out channels up to which the shared-memory tiles beat the implicit GEMM
AUTO_SKINNY_MAX = 4            # output channels up to which the implicit GEMM's skinny kernel wins
AUTO_WGRAD_MIN = 1024          # weights below which the block-reduction weight gradient beats the GEMM
AUTO_STAGED_MIN_WIDE = 64      # input channels from which a narrow output's staged weight gradient is chosen
# the bias gradient "made by the weight-gradient pass" (no launches of its own: gpunn.kernels.conv.wgrad_bias), a
# bias_grad version that "auto" chooses where the layer's weight-gradient version makes it (conv.ConvVersion.
# with_bias: these), and for a fused conv + ReLU + pool stage up to AUTO_POOL_BIAS_MAX_COUT output channels (the
# deep32x32 weight gradient's M, the CNN's conv2: the ones column lies inside its last N tile)
WGRAD_WITH_BIAS = ("deterministic",)
# ... and "winograd" (its dy transform's blocks sum dy, plain and on an upsampled input: no bias launches, two a
# conv otherwise) where this is on (H200, batch 64, one bench call: the autoencoder's gpu-bf16 epoch 0.6827 ->
# 0.6538 s, gpu-graph 1.2043 -> 1.1762 s; docs/notes/issue-42/h200-s56)
AUTO_WINOGRAD_BIAS = True
AUTO_POOL_BIAS_MAX_COUT = 32
AUTO_POOL_WGRAD_BIAS = "direct"  # that pass by a direct convolution where it fits (else the GEMM with a ones column)
AUTO_WINOGRAD_MIN_PRODUCT = 128 * 128  # in x out channels from which 3x3, padding-1 passes run Winograd F(2x2, 3x3)
AUTO_WINOGRAD_STEPS = ("forward", "backward_data", "backward_weight")  # ... the passes where it measured faster
SGD_MODES = ("flat", "per_layer")
COPY_MODES = ("sync", "pipelined")
UPSAMPLE_MODES = ("separate", "fused")
POOL_MODES = ("separate", "fused", "auto")
POOL_CONV_MODES = ("gemm", "direct")
POOL_GEMM = {"forward": "gemm", "backward_data": "gemm"}  # the fused stage's passes on pooled's GEMMs
POOL_DIRECT = {"forward": "direct", "backward_data": "direct"}  # ... as direct convolutions (gpu-graph)
AUTO_POOL_MAX_COUT = 32  # pool "auto": fused where the fused forward's 128x32 window tiles fit the conv (the CNN)
AUTO_POOL_MAX_K = 32     # ... or where its GEMM depth Cin*k*k is at most this (a first layer: the autoencoder's)
# ... and (fused or auto) where the conv's passes run ``winograd`` (conv_version): one stage on the Winograd passes
# with the pool in their transforms (gpunn.kernels.conv.winograd_pool; pool_winograd). Off: that conv keeps its
# separate MaxPool2d stage (today's launches)
AUTO_POOL_WINOGRAD = True
STEP_MODES = ("layers", "persistent", "phased")
PRECISIONS = ("fp32", "tf32", "bf16")
# a precision policy's products on the tensor cores: those at least this on each GEMM side (one MMA K step of 32;
# a quarter of a 128-wide tile). Smaller ones (first layers' K of 9 or 27, outputs of 3 or 10 channels) keep their
# float32 kernels: most of a tensor tile would be padding (the autoencoder's 256 -> 3 conv on the tensor tiles took
# 0.42 ms forward and 0.54 ms weight gradient on an H200, its float32 kernels 0.20 and 0.13)
TENSOR_MIN_SIDE = 32
# ... and a conv pass's channel side that a tensor tile's 128 rows or columns hold (forward and weight gradient: the
# output channels; input gradient: the input channels) at least this: the CNN's conv2 (16 -> 32) fills a quarter of
# it and ran slower there than on its float32 fused stage (H200, batch 64, docs/notes/issue-42/h200-s57: forward
# + pool 0.0223 ms direct against 0.0398 on the tensor_bf16 window tiles and 0.0366 + 0.0053 as tensor GEMM + pool;
# weight + bias gradient 0.0391 against 0.0687 at the best split)
TENSOR_MIN_CHANNELS = 64
HEAD_MODES = ("layers", "fused")
FUSED_HEAD_MAX_CLASSES = 32  # = gpunn.kernels.linear_head.MAX_CLASSES (a test checks): classes held in registers
PIPELINE_DEPTH = 3  # host batch buffers of the pipelined copy: one being filled, one in flight, one in use

# gpu-fused (the MLP) and gpu-im2col (the CNN and the autoencoder) are one design: data resident on the GPU, fused
# epilogues, deterministic reductions, every convolution pass an implicit-im2col GEMM. They train disjoint models
# (POLICY_MODELS), and each keeps the name its model's design has: the MLP's fused step (fewest launches), paper 004's
# "optimized v2" (im2col). One set of fields, two names; tests/test_gpu_engine.py checks that they stay so.
RESIDENT_FUSED = {"gemm": "auto", "fuse": True, "resident": True, "conv": FUSED_CONV, "pool_backward": "gather",
                  "pool": "auto"}

POLICIES = {
    "gpu-naive": Policy("gpu-naive", gemm="naive", fuse=False, resident=False, sgd="per_layer", blocks=True),
    "gpu-tiled": Policy("gpu-tiled", gemm="tiled16", fuse=False, resident=False, conv=TILED_CONV),
    "gpu-optimized": Policy("gpu-optimized", gemm="tiled16", fuse=True, resident=False, conv=OPTIMIZED_CONV,
                            pool_backward="gather", copy="pipelined", blocks=True),
    "gpu-fused": Policy("gpu-fused", **RESIDENT_FUSED),
    "gpu-im2col": Policy("gpu-im2col", **RESIDENT_FUSED),
    "gpu-graph": Policy("gpu-graph", gemm="auto", fuse=True, resident=True, graphs=True, graph_epoch=True,
                        conv=AUTO_CONV, pool_backward="gather", upsample="fused", pool="auto",
                        pool_conv=dict(POOL_DIRECT), step="persistent", head="fused"),
    # gpu-graph's design with every product that fills the tensor tiles on them (precision), per-layer stages
    **{f"gpu-{fmt}": Policy(f"gpu-{fmt}", gemm="auto", fuse=True, resident=True, graphs=True, graph_epoch=True,
                            conv=AUTO_CONV, pool_backward="gather", upsample="fused", pool="auto",
                            pool_conv=dict(POOL_DIRECT), head="fused", precision=fmt) for fmt in ("tf32", "bf16")},
}
# which models each GPU variant trains (the registry's `models`): E1-E3's MLP variants, E4's CNN variants and E5's
# autoencoder variants (paper 004's naive, "optimized v1" = gpu-tiled and "optimized v2" = gpu-im2col, and ours)
POLICY_MODELS = {
    "gpu-naive": ("mlp", "cnn", "autoencoder"),
    "gpu-tiled": ("mlp", "autoencoder"),
    "gpu-optimized": ("cnn",),
    "gpu-fused": ("mlp",),
    "gpu-im2col": ("cnn", "autoencoder"),
    "gpu-graph": ("mlp", "cnn", "autoencoder"),
    "gpu-tf32": ("mlp", "cnn", "autoencoder"),
    "gpu-bf16": ("mlp", "cnn", "autoencoder"),
}


def conv_version(policy: Policy, step: str, in_channels: int, out_channels: int, k: int, padding: int = 0,
                 size: tuple[int, int] | None = None, up: bool = False) -> str:
    """The conv version (gpunn.kernels.conv.VERSIONS[step]) of a layer in_channels -> out_channels, k x k, under
    `policy`: its named version, or for "auto" the fastest per shape in the H100 conv benchmark (issue-8 notes,
    batch 64, CNN and autoencoder shapes), all deterministic:
      forward / backward-data (a pass from ci to co channels: backward-data runs out -> in): shared-memory tiles
        while ci * co <= AUTO_TILED_MAX_PRODUCT and co > AUTO_SKINNY_MAX (cnn 1->16, 16->32, 32->16; ae 3->256),
        else the implicit GEMM (ae 256->128, and 256->3 on its skinny thread-per-row GEMM); a forward on an
        upsampled input (`up`, `size` given) with at most AUTO_SKINNY_MAX outputs runs ``phase`` where it fits (ae
        256->3: a direct convolution on the small map, conv.phase_up);
      weight gradient: on an upsampled input (`up`) with at most AUTO_SKINNY_MAX outputs, ``phase`` where it fits
        (ae 256->3: 0.031 ms against the staged version's 0.127 on an H200, batch 64); else
        for a narrow output (<= AUTO_SKINNY_MAX channels) from a wide input (>= AUTO_STAGED_MIN_WIDE)
        whose staged planes fit in shared memory (`size`, the input's height and width, given), the staged version
        (ae 256->3: 0.158 ms against the block reduction's 0.472 on the H100, batch 64; for a narrow INPUT, ae
        3->256, it took 0.276 ms against the implicit GEMM's 0.156, so that stays the GEMM); else the
        deterministic block reduction where the GEMM is small (Cout*Cin*k*k < AUTO_WGRAD_MIN: cnn conv1's 144
        weights) or its M = Cout is skinny, else the implicit GEMM;
      bias gradient: BIAS_WITH_WEIGHT where the layer's weight-gradient version (the same rules, with `size`)
        makes it (WGRAD_WITH_BIAS: cnn conv1's deterministic block reduction), and not on an upsampled input
        (`up`: the weight gradient is then an upsampled twin, none of which makes it), or where it is
        ``winograd`` and AUTO_WINOGRAD_BIAS is on (plain or upsampled); else the split reduction.
    Before these: 3x3 kernels with padding 1 and in * out channels >= AUTO_WINOGRAD_MIN_PRODUCT run the passes of
    AUTO_WINOGRAD_STEPS as ``winograd`` (ae 256->128, 128->128, and 128->256 on its upsampled input: conv.UP_VERSIONS'
    twin reads through the upsample)."""
    name = policy.conv[step]
    winograd = (name == "auto" and step in AUTO_WINOGRAD_STEPS and k == 3 and padding == 1
                and in_channels * out_channels >= AUTO_WINOGRAD_MIN_PRODUCT)
    if tensor_pass(policy, step, in_channels, out_channels, k, up):  # a product on the tensor cores' tiles
        return "winograd" if winograd else "implicit_gemm"
    if name != "auto":
        return name
    if winograd:
        return "winograd"
    if step in ("forward", "backward_data"):
        ci, co = (in_channels, out_channels) if step == "forward" else (out_channels, in_channels)
        if up and step == "forward" and size is not None and co <= AUTO_SKINNY_MAX:
            from gpunn.kernels.conv import phase_forward_fits  # (numba: the policy module itself stays plain data)

            if phase_forward_fits(ci, co, k, padding, *size):
                return "phase"
        return "tiled" if ci * co <= AUTO_TILED_MAX_PRODUCT and co > AUTO_SKINNY_MAX else "implicit_gemm"
    if step == "backward_weight":
        if up and size is not None and out_channels <= AUTO_SKINNY_MAX:
            from gpunn.kernels.conv import phase_fits  # (numba: the policy module itself stays plain data)

            if phase_fits(in_channels, out_channels, k, padding, *size):
                return "phase"
        if size is not None and out_channels <= AUTO_SKINNY_MAX and in_channels >= AUTO_STAGED_MIN_WIDE:
            from gpunn.kernels.conv import staged_fits  # (numba: the policy module itself stays plain data)

            if staged_fits(in_channels, out_channels, k, padding, *size):
                return "staged"
        small = out_channels * in_channels * k * k < AUTO_WGRAD_MIN or out_channels <= AUTO_SKINNY_MAX
        return "deterministic" if small else "implicit_gemm"
    wgrad = conv_version(policy, "backward_weight", in_channels, out_channels, k, padding, size, up=up)
    if (not up and wgrad in WGRAD_WITH_BIAS) or (AUTO_WINOGRAD_BIAS and wgrad == "winograd"):
        return BIAS_WITH_WEIGHT  # made by the weight-gradient launches
    return "split"  # the bias gradient: split over images, partial sums added in a fixed order


def pool_bias_with_weight(policy: Policy, in_channels: int, out_channels: int, k: int,
                          pooled: tuple[int, int] | None = None) -> str | None:
    """The version (gpunn.kernels.conv.POOL_WGRAD_BIAS) of a fused conv + ReLU + pool stage's weight-gradient pass
    that also makes its bias gradient under `policy`, or None: the stage's own weight and bias launches. Made by
    that pass where the bias_grad version is BIAS_WITH_WEIGHT or "auto": AUTO_POOL_WGRAD_BIAS ("direct") where its
    staged input band fits (`pooled`: the pooled output's height and width, given; conv.direct_layout; wide outputs
    in channel groups, the autoencoder's 3 -> 256), else "gemm" (its ones column) up to AUTO_POOL_BIAS_MAX_COUT
    output channels under "auto"."""
    name = policy.conv["bias_grad"]
    if name not in (BIAS_WITH_WEIGHT, "auto"):
        return None
    if AUTO_POOL_WGRAD_BIAS == "direct" and pooled is not None:
        from gpunn.kernels.conv import direct_layout  # (numba: the policy module itself stays plain data)

        if direct_layout(in_channels, out_channels, *pooled, k) is not None:
            return "direct"
    return "gemm" if name == BIAS_WITH_WEIGHT or out_channels <= AUTO_POOL_BIAS_MAX_COUT else None


def pool_winograd(policy: Policy, in_channels: int, out_channels: int, k: int, padding: int = 0) -> bool:
    """Whether a Conv2d (k x k, `padding`) + ReLU + MaxPool2d(2) run is one stage on Winograd's pooled passes
    (gpunn.kernels.conv.winograd_pool: bias, ReLU and the pool in the forward's output transform, the pooled
    gradient read through the route by the input and weight gradients) under `policy`: AUTO_POOL_WINOGRAD on, a
    fusing policy whose `pool` is not "separate", and the conv's forward, input and weight gradients all
    ``winograd`` (conv_version: 3x3, padding 1, in * out >= AUTO_WINOGRAD_MIN_PRODUCT under "auto"), on the tensor
    cores or not (the pooled passes take the same batched GEMM versions and BF16 buffers). The autoencoder's
    256 -> 128 conv2 under gpu-graph, gpu-tf32 and gpu-bf16."""
    return (AUTO_POOL_WINOGRAD and policy.fuse and policy.pool != "separate"
            and all(conv_version(policy, step, in_channels, out_channels, k, padding) == "winograd"
                    for step in ("forward", "backward_data", "backward_weight")))


def pool_fused(policy: Policy, in_channels: int, out_channels: int, k: int, padding: int = 0) -> bool:
    """Whether a Conv2d (k x k, `padding`) + ReLU + MaxPool2d(2) run is one fused stage under `policy` (its `pool`
    field; only with `fuse`, the fused epilogues): where the conv runs Winograd, its pooled passes (pool_winograd;
    the autoencoder's 256 -> 128 conv2, H200, batch 64: BF16 forward, the Winograd conv + a separate max pool,
    0.0826 -> 0.0727 ms, backward, the pool's gather + Winograd input gradient + weight and bias gradient, 0.1895 ->
    0.1758 ms; FP32 0.190 -> 0.178 and 0.397 -> 0.386 ms; every output bit for bit the separate path's). Else
    "fused" always; "auto" where the window versions' narrow tiles suit the conv:
    at most AUTO_POOL_MAX_COUT output channels (the CNN's conv2), or a GEMM depth in_channels * k * k of at most
    AUTO_POOL_MAX_K (the autoencoder's conv1, 3 -> 256: K = 27, one or two K steps; H100, batch 64: the epoch
    2.55 -> 2.39 s). Those window tiles did not suit the autoencoder's 256 -> 128 conv (before Winograd: 547 us
    fused on the 128x32 window tiles against the 128x128 tiles' 353 + 37 us plus the pool's 6 us); with
    AUTO_POOL_WINOGRAD off it keeps its separate pool stage."""
    if pool_winograd(policy, in_channels, out_channels, k, padding):
        return True
    if not policy.fuse or policy.pool == "separate" or any(
            tensor_pass(policy, step, in_channels, out_channels, k) for step in ("forward", "backward_weight")):
        return False  # (a conv with a tensor-core pass keeps it: the fused stage's kernels are float32)
    return (policy.pool == "fused" or out_channels <= AUTO_POOL_MAX_COUT
            or in_channels * k * k <= AUTO_POOL_MAX_K)


def head_fused(policy: Policy, loss: str | None, classes: int) -> bool:
    """Whether a model's final Linear (`classes` outputs) and its `loss` head are one stage under `policy` (its
    `head` field, with `fuse`): only for the softmax_ce loss and at most FUSED_HEAD_MAX_CLASSES classes. On the
    H100 the CNN's head (Linear(4608, 10), batch 64) took six launches, about 38 us timed alone."""
    return (policy.fuse and policy.head == "fused" and loss == "softmax_ce"
            and 2 <= classes <= FUSED_HEAD_MAX_CLASSES)


def precision_gemm(policy: Policy) -> str | None:
    """The GEMM version a tf32 or bf16 policy's tensor-core products run (None for fp32): the warp-MMA
    tensor_<format> (gpunn.kernels.gemm.tensor), on every GPU from compute capability 8.0. Hopper's wgmma_<format>
    measured no faster at the autoencoder's shapes on an H200 (gemm/NOTES-tensor.md), so it is not chosen."""
    return None if policy.precision == "fp32" else f"tensor_{policy.precision}"


def tensor_side(m: int, n: int, k: int) -> bool:
    """Whether a GEMM of m x n over k fills the tensor cores' tiles: each side at least TENSOR_MIN_SIDE."""
    return min(m, n, k) >= TENSOR_MIN_SIDE


def tensor_pass(policy: Policy, step: str, in_channels: int, out_channels: int, k: int, up: bool = False) -> bool:
    """Whether a Conv2d pass (forward, backward_data, backward_weight) runs on the tensor cores under `policy`: a
    tf32 / bf16 policy and both channel sides of its GEMM at least TENSOR_MIN_SIDE (the pixel side always is):
    forward N = out, K = in k k; input gradient N = in, K = out k k, on an upsampled input (`up`) out (k+1)^2 (one
    GEMM over the summed taps, conv.upsampled: the autoencoder's 256 -> 3 conv, K = 48; H200, batch 64: 0.041 ->
    0.030 ms in BF16); weight gradient M = out, N = in k k. The bias gradient is a sum: float32."""
    if policy.precision == "fp32" or step == "bias_grad":
        return False
    ci, co = (out_channels, in_channels) if step == "backward_data" else (in_channels, out_channels)
    taps = (k + 1) * (k + 1) if up and step == "backward_data" else k * k
    return co >= TENSOR_MIN_CHANNELS and tensor_side(TENSOR_MIN_SIDE, co, ci * taps)


def gemm_version(policy: Policy, rows: int, cols: int, k: int | None = None) -> str:
    """The GEMM version a layer uses for an output of rows x cols over `k` (given under a precision policy) under
    `policy`."""
    if policy.precision != "fp32" and k is not None and tensor_side(rows, cols, k):
        return precision_gemm(policy)
    if policy.gemm != "auto":
        return policy.gemm
    return "regblock" if rows * cols >= 64 * 64 * AUTO_MIN_BLOCKS else "tiled16"


# Split-K of a dense layer's GEMM under an "auto" policy (gemm_splits): only where the output's tiles leave most
# SMs idle AND each tile's K loop is long, so that splitting clearly pays for the second (sum) launch.
AUTO_SPLIT_SM_SHARE = 4  # split only when the tiles fill at most 1/4 of the SMs ...
AUTO_SPLIT_MIN_K = 1024  # ... and K is at least this (4 chunks of gemm.split_k.SPLIT_MIN_K = 256)
# ... a tensor-core GEMM's (128x128 tiles) also over a shorter K: in chunks of this many K indices (two of its K
# steps), at most one split per SM. The MLP's fc1 forward (64 x 256 over K = 785: 2 tiles) on an H200 (the probe
# in docs/notes/issue-42/h200-s54): bf16 0.036 ms whole, 0.026 / 0.018 / 0.014 / 0.012 in 2 / 4 / 7 / 13 splits
TENSOR_SPLIT_K = 64


def gemm_splits(policy: Policy, tiles: int, k: int, multiprocessors: int, version: str | None = None) -> int | None:
    """The ``splits`` a layer passes to its dense GEMM launcher: None (gpunn.kernels.gemm.gemm_split_k's
    automatic count) when `policy`'s gemm is "auto", the output's `tiles` (blocks of the version gemm_version
    chose) fill at most 1/AUTO_SPLIT_SM_SHARE of the `multiprocessors`, and K >= AUTO_SPLIT_MIN_K; else 1 (one
    launch, as before). On an H100 (132 SMs, batch 64): the CNN's FC forward, 64 x 10 over K = 4608 (tiled16:
    4 tiles, each looping over all of K), splits (18 chunks of 256: 72 blocks); the MLP keeps single launches:
    fc1 64 x 256 over K = 785 (64 tiles, about half the SMs, a short K) and fc2 64 x 10 over K = 257 (4 tiles,
    but one chunk's worth of K); backward GEMMs have K = batch or K = 10. Under the simulator (1 SM) nothing
    splits. The `version` on the tensor cores (precision_gemm) with so few tiles splits in
    min(SMs / tiles, K / TENSOR_SPLIT_K) rounded up (an int; the MLP's fc1 forward: 13 on an H200)."""
    if policy.gemm != "auto":
        return 1
    if version is not None and version == precision_gemm(policy):
        if AUTO_SPLIT_SM_SHARE * tiles > multiprocessors:
            return 1
        return max(1, min(-(-multiprocessors // tiles), -(-k // TENSOR_SPLIT_K)))
    return None if AUTO_SPLIT_SM_SHARE * tiles <= multiprocessors and k >= AUTO_SPLIT_MIN_K else 1
