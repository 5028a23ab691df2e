"""Offline synthetic datasets with learnable class structure, byte-for-byte reproducible.

MNIST-like (`make_mnist_like`): the ten digits drawn as pen strokes (lines and arcs, two or three styles
per digit) stored as distance fields; every sample warps its digit with a random near-identity linear map
(scale, slant, aspect), a shift and a smooth elastic displacement, picks a stroke thickness and a contrast,
and gets multiplicative stroke noise. The background is 0 as in MNIST except for a sparse faint speckle
(about 1.5 % of the empty pixels).

CIFAR-like (`make_cifar_like`): ten classes = five shapes (disc, square, triangle, ring, cross) x (plain,
striped). Each sample puts one anti-aliased shape of random size, position and orientation on a random
colour gradient background; the shape's colour is drawn around a class colour with a wide spread, striped
classes modulate it with a triangle-wave grating of random period, direction and phase, and Gaussian
pixel noise is added on top.

Reproducibility: all randomness comes from `np.random.default_rng([seed, stream])`; the per-pixel work is
done in float64 with elementwise IEEE operations only (+, -, *, /, sqrt, floor, min/max, gathers): no BLAS,
no reductions, no numpy transcendental functions (their SIMD versions differ between CPUs; the few fixed
arc points of the digit strokes use Python's math.cos/sin); images are processed in chunks of a fixed
size. So the bytes depend only on (n, seed), and the registry md5s of the offline datasets hold them to it.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

CHUNK = 1024  # samples per rendering chunk (fixed: the random draws per chunk depend on it)

# ----------------------------------------------------------------------------------------------------------
# MNIST-like stroke digits

MNIST_SIZE = 28
_BOX_W, _BOX_H = 14.0, 20.0  # the digit box in pixels (MNIST digits fit a 20x20 box, most are narrower)
_BANK_HALF = 20.0  # the distance-field bank covers [-20, 20] px around the centre
_BANK_STEP = 0.5
_BANK_N = int(2 * _BANK_HALF / _BANK_STEP) + 1  # 81


def _arc(cu, cv, ru, rv, a0, a1, n=18):
    """Points of an elliptic arc in digit-box coordinates (u right, v down); angles in degrees, 0 = right,
    90 = down. Uses math.cos/sin on a handful of fixed angles (platform libm, correctly rounded in practice)."""
    pts = []
    for i in range(n + 1):
        a = math.radians(a0 + (a1 - a0) * i / n)
        pts.append((cu + ru * math.cos(a), cv + rv * math.sin(a)))
    return pts


def _digit_strokes():
    """Per digit, a list of styles; each style a list of polylines in the unit digit box."""
    A = _arc
    return {
        0: [
            [A(0.5, 0.5, 0.5, 0.5, 0, 360, 32)],
            [A(0.5, 0.5, 0.36, 0.5, -30, 330, 32)],
        ],
        1: [
            [[(0.5, 0.0), (0.5, 1.0)]],
            [[(0.2, 0.22), (0.55, 0.0), (0.5, 1.0)]],
            [[(0.25, 0.2), (0.5, 0.0), (0.5, 1.0)], [(0.2, 1.0), (0.8, 1.0)]],
        ],
        2: [
            [A(0.5, 0.28, 0.46, 0.28, 190, 385) + [(0.0, 1.0), (1.0, 1.0)]],
            [A(0.5, 0.3, 0.45, 0.3, 180, 400) + [(0.25, 0.85)]
             + A(0.17, 0.9, 0.12, 0.1, 0, 300, 8) + [(0.35, 0.95), (1.0, 1.0)]],
        ],
        3: [
            [A(0.5, 0.25, 0.42, 0.25, 200, 450), A(0.5, 0.75, 0.47, 0.25, 270, 520)],
            [[(0.05, 0.0), (0.95, 0.0), (0.4, 0.42)], A(0.5, 0.71, 0.47, 0.29, 250, 520)],
        ],
        4: [
            [[(0.7, 1.0), (0.7, 0.0), (0.0, 0.68), (1.0, 0.68)]],
            [[(0.2, 0.0), (0.1, 0.6), (1.0, 0.6)], [(0.75, 0.2), (0.75, 1.0)]],
        ],
        5: [
            [[(0.9, 0.0), (0.2, 0.0), (0.15, 0.45)] + A(0.5, 0.7, 0.45, 0.3, 215, 520)],
            [[(0.95, 0.02), (0.25, 0.0), (0.2, 0.4)] + A(0.45, 0.68, 0.5, 0.32, 230, 460)
             + [(0.0, 0.9)]],
        ],
        6: [
            [[(0.85, 0.0), (0.4, 0.22), (0.12, 0.62)], A(0.5, 0.72, 0.4, 0.28, 180, 540)],
            [A(0.9, 0.65, 0.8, 0.65, 250, 180, 10), A(0.5, 0.75, 0.38, 0.25, 180, 540)],
        ],
        7: [
            [[(0.0, 0.0), (1.0, 0.0), (0.35, 1.0)]],
            [[(0.0, 0.0), (1.0, 0.0), (0.4, 1.0)], [(0.3, 0.52), (0.9, 0.52)]],
            [[(0.0, 0.2), (0.05, 0.0), (1.0, 0.0), (0.6, 0.5), (0.45, 1.0)]],
        ],
        8: [
            [A(0.5, 0.25, 0.38, 0.25, 0, 360, 24), A(0.5, 0.74, 0.46, 0.26, 0, 360, 24)],
            [A(0.55, 0.24, 0.32, 0.24, 0, 360, 24), A(0.45, 0.72, 0.45, 0.28, 0, 360, 24)],
        ],
        9: [
            [A(0.5, 0.3, 0.45, 0.3, 0, 360, 24), [(0.95, 0.3), (0.9, 1.0)]],
            [A(0.5, 0.3, 0.45, 0.3, 0, 360, 24), [(0.95, 0.3), (0.8, 0.8), (0.4, 1.0)]],
        ],
    }


def _segment_distance(px, py, ax, ay, bx, by):
    """Distance from points (px, py) to the segment a-b (elementwise float64)."""
    dx, dy = bx - ax, by - ay
    len2 = dx * dx + dy * dy
    if len2 == 0.0:
        t = np.zeros_like(px)
    else:
        t = np.clip(((px - ax) * dx + (py - ay) * dy) / len2, 0.0, 1.0)
    ex = px - (ax + t * dx)
    ey = py - (ay + t * dy)
    return np.sqrt(ex * ex + ey * ey)


@lru_cache(maxsize=1)
def _digit_bank():
    """Distance fields (in pixels) of every digit style on an 81x81 grid; returns (bank, style_class)."""
    coords = (np.arange(_BANK_N, dtype=np.float64) * _BANK_STEP) - _BANK_HALF
    gy, gx = np.meshgrid(coords, coords, indexing="ij")
    fields, style_class = [], []
    for digit, styles in _digit_strokes().items():
        for polylines in styles:
            dist = np.full(gx.shape, np.inf)
            for line in polylines:
                pts = [((u - 0.5) * _BOX_W, (v - 0.5) * _BOX_H) for u, v in line]
                for (ax, ay), (bx, by) in zip(pts[:-1], pts[1:]):
                    dist = np.minimum(dist, _segment_distance(gx, gy, ax, ay, bx, by))
            fields.append(dist)
            style_class.append(digit)
    bank = np.stack(fields)
    bank.setflags(write=False)
    return bank, np.array(style_class, dtype=np.int64)


def _bilinear(table: np.ndarray, k: np.ndarray, fy: np.ndarray, fx: np.ndarray) -> np.ndarray:
    """Bilinear samples of table[k] (K, H, W) at fractional indices (fy, fx) (clamped to the edges).
    k has shape (n, 1), fy/fx shape (n, P)."""
    h, w = table.shape[1:]
    fy = np.clip(fy, 0.0, h - 1.0)
    fx = np.clip(fx, 0.0, w - 1.0)
    y0 = np.minimum(np.floor(fy).astype(np.int64), h - 2)
    x0 = np.minimum(np.floor(fx).astype(np.int64), w - 2)
    wy = fy - y0
    wx = fx - x0
    flat = table.reshape(-1)
    base = k * (h * w) + y0 * w + x0
    v00 = flat.take(base)
    v01 = flat.take(base + 1)
    v10 = flat.take(base + w)
    v11 = flat.take(base + w + 1)
    top = v00 + (v01 - v00) * wx
    bottom = v10 + (v11 - v10) * wx
    return top + (bottom - top) * wy


_ELASTIC_GRID = 4  # coarse displacement grid (4x4 control points over the image)


def _render_digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    bank, style_class = _digit_bank()
    styles_of = [np.flatnonzero(style_class == d) for d in range(10)]
    labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
    # per-sample parameters, all drawn up front
    pick = rng.random(n)
    style = np.empty(n, dtype=np.int64)
    for d in range(10):
        sel = labels == d
        choices = styles_of[d]
        style[sel] = choices[np.minimum((pick[sel] * len(choices)).astype(np.int64), len(choices) - 1)]
    scale = rng.uniform(0.85, 1.2, n)  # inverse scale: > 1 draws the digit smaller
    aspect = rng.uniform(-0.15, 0.15, (n, 2))
    shear = rng.uniform(-0.3, 0.3, (n, 2))
    shift = rng.uniform(-2.5, 2.5, (n, 2))
    half_thick = rng.uniform(0.7, 1.7, n)
    contrast = rng.uniform(0.7, 1.0, n)

    s = MNIST_SIZE
    pix = np.arange(s, dtype=np.float64) - (s - 1) / 2.0
    qy, qx = np.meshgrid(pix, pix, indexing="ij")
    qy = qy.reshape(1, -1)
    qx = qx.reshape(1, -1)
    # the elastic displacement is a coarse random grid upsampled by separable linear interpolation
    g = _ELASTIC_GRID
    pos = np.arange(s, dtype=np.float64) * (g - 1) / (s - 1)
    i0 = np.minimum(np.floor(pos).astype(np.int64), g - 2)
    w1 = pos - i0
    w0 = 1.0 - w1

    out = np.empty((n, s * s), dtype=np.uint8)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        m = stop - start
        sl = slice(start, stop)
        coarse = rng.normal(0.0, 1.1, (2 * m, g, g))
        stroke_noise = rng.random((m, s * s))
        speckle = rng.random((m, s * s))

        rows = coarse[:, i0, :] * w0[:, None] + coarse[:, i0 + 1, :] * w1[:, None]  # (2m, s, g)
        disp = (rows[:, :, i0] * w0 + rows[:, :, i0 + 1] * w1).reshape(2 * m, s * s)
        ey, ex = disp[:m], disp[m:]

        ux = qx - shift[sl, 0:1] + ex
        uy = qy - shift[sl, 1:2] + ey
        sc = scale[sl, None]
        px = sc * ((1.0 + aspect[sl, 0:1]) * ux + shear[sl, 0:1] * uy)
        py = sc * (shear[sl, 1:2] * ux + (1.0 + aspect[sl, 1:2]) * uy)
        fx = (px + _BANK_HALF) / _BANK_STEP
        fy = (py + _BANK_HALF) / _BANK_STEP
        dist = _bilinear(bank, style[sl, None], fy, fx) / sc  # back to output pixels (approximately)

        ink = np.clip((half_thick[sl, None] - dist) / 1.2 + 0.5, 0.0, 1.0)
        value = ink * contrast[sl, None] * (0.8 + 0.4 * stroke_noise) * 255.0
        # sparse speckle on the background: about 1.5 % of the empty pixels get a faint dot
        value = value + np.where(ink > 0.0, 0.0, np.maximum(speckle - 0.985, 0.0) * (40.0 / 0.015))
        out[sl] = np.rint(np.clip(value, 0.0, 255.0)).astype(np.uint8)
    return out.reshape(n, s, s), labels


def make_mnist_like(n_train: int, n_test: int, seed: int):
    """(x_train, y_train, x_test, y_test): uint8 images (N, 28, 28) of stroke digits and uint8 labels 0..9."""
    x_train, y_train = _render_digits(int(n_train), np.random.default_rng([int(seed), 0]))
    x_test, y_test = _render_digits(int(n_test), np.random.default_rng([int(seed), 1]))
    return x_train, y_train, x_test, y_test


# ----------------------------------------------------------------------------------------------------------
# CIFAR-like textured shapes

CIFAR_SIZE = 32
SHAPES = ("disc", "square", "triangle", "ring", "cross")
# class colours (RGB in 0..1): one per class, spread around the colour cube; sample colours scatter widely
_CLASS_COLOURS = np.array([
    [0.85, 0.25, 0.20], [0.20, 0.60, 0.85], [0.90, 0.80, 0.20], [0.30, 0.75, 0.30], [0.65, 0.35, 0.80],
    [0.95, 0.55, 0.15], [0.15, 0.35, 0.70], [0.60, 0.85, 0.55], [0.80, 0.45, 0.60], [0.45, 0.50, 0.40],
])
_SQRT3_2 = math.sqrt(3.0) / 2.0


def _shape_sdf(shape: int, u: np.ndarray, v: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Approximate signed distance (pixels, negative inside) to a shape of radius r, in its own frame (u, v)."""
    if shape == 0:  # disc
        return np.sqrt(u * u + v * v) - r
    if shape == 1:  # square
        return np.maximum(np.abs(u), np.abs(v)) - 0.8 * r
    if shape == 2:  # equilateral triangle: three half-planes, normals 120 degrees apart
        d1 = -v
        d2 = _SQRT3_2 * u + 0.5 * v
        d3 = -_SQRT3_2 * u + 0.5 * v
        return np.maximum(np.maximum(d1, d2), d3) - 0.5 * r
    if shape == 3:  # ring
        return np.abs(np.sqrt(u * u + v * v) - 0.7 * r) - 0.3 * r
    # cross: union of two bars
    au, av = np.abs(u), np.abs(v)
    bar1 = np.maximum(au - r, av - 0.3 * r)
    bar2 = np.maximum(av - r, au - 0.3 * r)
    return np.minimum(bar1, bar2)


def _render_shapes(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
    shape_of = labels.astype(np.int64) % 5
    striped = labels >= 5
    # per-sample parameters
    centre = rng.uniform(10.0, 22.0, (n, 2))
    radius = rng.uniform(6.0, 11.0, n)
    orient = rng.normal(0.0, 1.0, (n, 2))
    norm = np.sqrt(orient[:, 0] * orient[:, 0] + orient[:, 1] * orient[:, 1]) + 1e-12
    cos_a, sin_a = orient[:, 0] / norm, orient[:, 1] / norm
    fg = np.clip(_CLASS_COLOURS[labels] + rng.normal(0.0, 0.2, (n, 3)), 0.0, 1.0)
    bg = rng.uniform(0.05, 0.95, (n, 3))
    grad = rng.normal(0.0, 0.012, (n, 2, 3))  # background colour change per pixel in x and y
    stripe_dir = rng.normal(0.0, 1.0, (n, 2))
    snorm = np.sqrt(stripe_dir[:, 0] * stripe_dir[:, 0] + stripe_dir[:, 1] * stripe_dir[:, 1]) + 1e-12
    period = rng.uniform(3.0, 6.0, n)
    stripe_dir = stripe_dir / (snorm * period)[:, None]
    phase = rng.random(n)
    depth = rng.uniform(0.4, 0.8, n)

    s = CIFAR_SIZE
    pix = np.arange(s, dtype=np.float64) + 0.5
    gy, gx = np.meshgrid(pix, pix, indexing="ij")
    gy = gy.reshape(1, -1)
    gx = gx.reshape(1, -1)

    out = np.empty((n, 3, s * s), dtype=np.uint8)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        m = stop - start
        sl = slice(start, stop)
        noise = rng.normal(0.0, 0.05, (m, 3, s * s))

        dx = gx - centre[sl, 0:1]
        dy = gy - centre[sl, 1:2]
        c, sn = cos_a[sl, None], sin_a[sl, None]
        u = c * dx + sn * dy
        v = -sn * dx + c * dy
        r = radius[sl, None]
        sdf = np.empty((m, s * s))
        for shape in range(5):
            rows = np.flatnonzero(shape_of[sl] == shape)
            if len(rows):
                sdf[rows] = _shape_sdf(shape, u[rows], v[rows], r[rows])
        alpha = np.clip(0.5 - sdf, 0.0, 1.0)

        t = dx * stripe_dir[sl, 0:1] + dy * stripe_dir[sl, 1:2] + phase[sl, None]
        tri = np.abs(2.0 * (t - np.floor(t)) - 1.0)  # triangle wave in [0, 1]
        texture = np.where(striped[sl, None], 1.0 - depth[sl, None] * tri, 1.0)

        for ch in range(3):
            back = bg[sl, ch:ch + 1] + grad[sl, 0, ch:ch + 1] * (gx - 16.0) + grad[sl, 1, ch:ch + 1] * (gy - 16.0)
            front = fg[sl, ch:ch + 1] * texture
            value = back + (front - back) * alpha + noise[:, ch]
            out[sl, ch] = np.rint(np.clip(value, 0.0, 1.0) * 255.0).astype(np.uint8)
    return out.reshape(n, 3, s, s), labels


def make_cifar_like(n_train: int, n_test: int, seed: int):
    """(x_train, y_train, x_test, y_test): uint8 images (N, 3, 32, 32) of textured shapes and uint8 labels."""
    x_train, y_train = _render_shapes(int(n_train), np.random.default_rng([int(seed), 0]))
    x_test, y_test = _render_shapes(int(n_test), np.random.default_rng([int(seed), 1]))
    return x_train, y_train, x_test, y_test
