"""Issue 43, stop 61: a CPU emulation of GpuSmo's rounds (the reference selection, a numba CPU copy of the local solver) on
MNIST a vs b with flipped labels; usage: python emu.py N Q keep|plain [FLIP]. Not a test."""
import gzip
import sys
import time

import numba
import numpy as np

ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]  # the repository
sys.path.insert(0, str(ROOT / "src"))
from gpunn.kernels.smo import LOCAL_EPS_SHARE, LOCAL_STEPS_PER_POINT, TAU, pair_step
from gpunn.smo import gap, select_working_set

ps = numba.njit(pair_step)

@numba.njit
def local(kk, yy, a, g, c, eps, q):
    n = yy.size
    local_eps = eps
    for step in range(LOCAL_STEPS_PER_POINT * q):
        gmax = -1e300; i = -1; fmin = 1e300
        for t in range(n):
            f = -yy[t] * g[t]
            up = (yy[t] > 0 and a[t] < c) or (yy[t] < 0 and a[t] > 0)
            lo = (yy[t] > 0 and a[t] > 0) or (yy[t] < 0 and a[t] < c)
            if up and f > gmax:
                gmax = f; i = t
            if lo and f < fmin:
                fmin = f
        if i < 0:
            break
        gp = gmax - fmin
        if step == 0:
            local_eps = max(eps, LOCAL_EPS_SHARE * gp)
        if gp < local_eps:
            break
        best = 1e300; j = -1
        for t in range(n):
            f = -yy[t] * g[t]
            lo = (yy[t] > 0 and a[t] > 0) or (yy[t] < 0 and a[t] < c)
            if lo and f < gmax:
                quad = kk[i, i] + kk[t, t] - 2.0 * kk[i, t]
                if quad <= 0.0:
                    quad = TAU
                o = -((gmax - f) ** 2) / quad
                if o < best:
                    best = o; j = t
        if j < 0:
            break
        ai, aj = ps(yy[i], yy[j], a[i], a[j], g[i], g[j], kk[i, i], kk[j, j], kk[i, j], c)
        dai = ai - a[i]; daj = aj - a[j]
        for t in range(n):
            g[t] += yy[t] * (yy[i] * dai * kk[i, t] + yy[j] * daj * kk[j, t])
        a[i] += dai; a[j] += daj
    return a

def solve(K, y, c, q, eps=1e-3, keep_half=False, max_rounds=3000):
    n = y.size
    alpha = np.zeros(n); grad = -np.ones(n)
    prev = np.zeros(0, np.int64)
    for r in range(max_rounds):
        gp = gap(y, alpha, grad, c)
        if gp < eps:
            return r, alpha, grad
        if keep_half:
            from gpunn.smo import select_round
            _, sets = select_round(y, alpha, grad, c, np.array([0, n]), [0], q, eps, {0: prev} if prev.size else None)
            ws = sets[0]
        else:
            ws = select_working_set(y, alpha, grad, c, q)
        kk = K[np.ix_(ws, ws)].astype(np.float64)
        a0 = alpha[ws].copy()
        a = local(kk, y[ws].astype(np.float64), a0.copy(), grad[ws].copy(), c, eps, q)
        d = a - a0
        m = d != 0
        grad += y * (K[ws[m]].astype(np.float64).T @ (y[ws[m]] * d[m]))
        alpha[ws] = a
        prev = ws
        if r % 100 == 0:
            print(f"  round {r}: gap {gp:.4g}, moved {m.sum()}", flush=True)
    return max_rounds, alpha, grad

def mnist(a, b, n):
    with gzip.open(ROOT.parent / "shared/data/real/mnist/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float64)
    with gzip.open(ROOT.parent / "shared/data/real/mnist/train-labels-idx1-ubyte.gz") as f:
        lab = np.frombuffer(f.read(), np.uint8, offset=8)
    idx = np.concatenate([np.flatnonzero(lab == a)[: n // 2], np.flatnonzero(lab == b)[: n // 2]])
    x = x[idx]; yy = np.where(lab[idx] == a, 1.0, -1.0)
    x = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1)
    return x, yy

if __name__ == "__main__":
    n, q, keep = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "keep"
    x, y = mnist(4, 9, n)
    flip = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    y = np.where(np.random.default_rng(0).random(n) < flip, -y, y)
    gamma = 1.0 / (x.shape[1] * x.var())
    sq = (x * x).sum(1)
    K = np.exp(-gamma * np.maximum(sq[:, None] + sq[None] - 2 * x @ x.T, 0)).astype(np.float32)
    t0 = time.time()
    r, alpha, grad = solve(K, y, 10.0, q, keep_half=keep)
    print(f"n {n} q {q} keep {keep}: {r} rounds, {time.time()-t0:.1f} s, SVs {(alpha>0).sum()}, bounded {(alpha>=10).sum()}")
    from sklearn.svm import SVC
    t0 = time.time(); svc = SVC(kernel="precomputed", C=10.0).fit(K.astype(np.float64), y)
    print(f"libsvm {time.time()-t0:.1f} s, SVs {svc.support_.size}, iterations {svc.n_iter_}")
