"""The transposed state walk's chunk step (src/cuda/chunk_fwd_state_t.cu) in
float64, as it is and with the lookahead planned in bench/NOTES.md ("Next
(after stop 54)"), with the kernel's bf16 roundings emulated: does forming
X(i + 1) = K(i + 1) S(i + 1) from the state before the update,

    X(i + 1) = exp(gL) K(i + 1) S(i) + C(i) U(i),   C(i) = K(i + 1) K(i)^T diag(cu(i)),

cost accuracy? One (sequence, head), K = V = 128, chunks of 64, bf16 k and v
(exact, raw: k's rstd in the scales b = beta exp(gc) rk and cu = rk exp(gL -
gc)), S, U, C as bf16 hi + lo operands, T and R rounded to bf16 once (the
walk's operands). Prints the largest relative error of X and of the final
state against the exact walk, both ways.

    python3 bench/walk_lookahead_model.py [chunks]   (numpy; a few seconds)
"""
import sys

import numpy as np

C, K, V = 64, 128, 128


def bf16(x):
    """round to the nearest bf16 (ties to even), as float64"""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32).astype(np.float64)


def hilo(x):
    h = bf16(x)
    return h, bf16(x - h)


def mm_hilo(a, b_hi, b_lo):
    """a (exact bf16) times a hi + lo operand, fp32 sums (modelled in float64)"""
    return a @ b_hi + a @ b_lo


def walk(k, v, g, beta, lookahead, rnd):
    n = len(g) // C
    S = np.zeros((K, V))
    Xn = None
    xerr = []
    for i in range(n):
        t = slice(i * C, (i + 1) * C)
        kr, b = k[t], beta[t]
        rk = 1 / np.linalg.norm(kr, axis=1)
        gc = np.cumsum(g[t])
        gL = gc[-1]
        kh = kr * rk[:, None]
        A = np.tril(b[:, None] * np.exp(gc[:, None] - gc[None, :]) * (kh @ kh.T), -1)
        Tm = np.linalg.inv(np.eye(C) + A)
        if rnd:
            Tm = bf16(Tm)
        FB, CU = b * np.exp(gc) * rk, rk * np.exp(gL - gc)
        X = kr @ S if not rnd else mm_hilo(kr, *hilo(S))
        if lookahead and Xn is not None:
            X = Xn
        if i > 0:
            xerr.append(np.abs(X - kr @ S).max() / np.abs(kr @ S).max())
        R = b[:, None] * v[t] - FB[:, None] * X
        U = Tm @ (bf16(R) if rnd else R)
        if lookahead and i + 1 < n:
            k1 = k[(i + 1) * C:(i + 2) * C]
            Cm = (k1 @ kr.T) * CU[None, :]
            if rnd:
                ch, cl = hilo(Cm)
                uh, ul = hilo(U)
                Xn = np.exp(gL) * mm_hilo(k1, *hilo(S)) + (ch @ uh + ch @ ul + cl @ uh)
            else:
                Xn = np.exp(gL) * (k1 @ S) + Cm @ U
        Ud = CU[:, None] * U
        S = np.exp(gL) * S + (mm_hilo(kr.T, *hilo(Ud)) if rnd else kr.T @ Ud)
    return S, max(xerr) if xerr else 0.0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    rng = np.random.default_rng(1)
    k = bf16(rng.standard_normal((n * C, K)))
    v = bf16(rng.standard_normal((n * C, V)))
    g = -np.abs(rng.standard_normal(n * C)) * 0.05
    beta = 1 / (1 + np.exp(-rng.standard_normal(n * C)))
    exact, _ = walk(k, v, g, beta, False, False)
    ahead, _ = walk(k, v, g, beta, True, False)
    print(f"{n} chunks; exact arithmetic: the two walks' states {np.abs(ahead - exact).max() / np.abs(exact).max():.1e} apart")
    for name, la in (("as now", False), ("lookahead", True)):
        S, xe = walk(k, v, g, beta, la, True)
        print(f"bf16 operands, {name:9s}: X {xe:.1e}, final state {np.abs(S - exact).max() / np.abs(exact).max():.2e}")


if __name__ == "__main__":
    main()
