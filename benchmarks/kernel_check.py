"""The fused CEM attention kernel against an independent float64 reference, on fresh random inputs: the
output and every gradient, in float32, bf16 and fp16, for the shared, per-head and absent key-query
diagonals, at the 134M shape (K = 12 heads of d = 64, D = 768) with a ragged length, plus a cached
decoding offset (q_start > 0). Prints one line per case with the relative errors ‖x − ref‖ / ‖ref‖ and
exits 1 if any case fails its dtype's tolerance or writes a non-finite value.

    python benchmarks/kernel_check.py [--device cuda] [--length 1000] [--heads 12] [--head-dim 64]

On the CPU the kernel runs in Triton's interpreter (slow: use small sizes). The reference is written here
from the formula of docs/kernels.md, not taken from cem.layers:

    logit_kij = (k_j^k · q_i^k + ĥ_j · qd_i^k) / sqrt(d) - m_k (i_abs - j) + s_k [i_abs = j],  j <= i_abs
    o_i^k     = Σ_j softmax_j(logit_kij) k_j^k
"""

from __future__ import annotations

import argparse
import sys

import torch

from cem.kernels import triton_cem_attention

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def reference(q, k, qd, hn, slopes, sb, q_start):
    """float64 CEM attention core from its formula (inputs already float64)."""
    d, Jq, Jk = q.shape[-1], q.shape[2], k.shape[2]
    s = torch.einsum("bkid,bkjd->bkij", q, k)
    if qd is not None:
        s = s + (torch.einsum("bid,bjd->bij", qd, hn)[:, None] if qd.dim() == 3 else torch.einsum("bkid,bjd->bkij", qd, hn))
    i = torch.arange(Jq, device=q.device)[:, None] + q_start
    j = torch.arange(Jk, device=q.device)[None, :]
    dist = (i - j).double()
    s = s / d**0.5 - slopes.double()[:, None, None] * dist + sb[:, None, None] * (dist == 0).double()
    s = s.masked_fill(dist < 0, float("-inf"))
    return torch.softmax(s, -1) @ k


def check(device, dtype, diag, B, K, Jq, q_start, d, D, gen) -> bool:
    Jk = q_start + Jq

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype).requires_grad_()

    q, k = rand(B, K, Jq, d), rand(B, K, Jk, d)
    qd = None if diag is None else rand(*((B, Jq, D) if diag == "shared" else (B, K, Jq, D)), scale=0.1)
    hn = None if diag is None else rand(B, Jk, D)
    slopes = 2.0 ** -torch.arange(1, K + 1, device=device, dtype=torch.float32)
    sb = (torch.randn(K, generator=gen, device=device)).requires_grad_()
    ins = [t for t in (q, k, qd, hn, sb) if t is not None]
    o = triton_cem_attention(q, k, qd, hn, slopes, sb, q_start)
    g = torch.randn(o.shape, generator=gen, device=device).to(dtype)
    grads = torch.autograd.grad(o, ins, g)
    ref_in = [t.detach().double().requires_grad_() for t in ins]
    q2, k2, sb2 = ref_in[0], ref_in[1], ref_in[-1]
    qd2, hn2 = (ref_in[2], ref_in[3]) if diag is not None else (None, None)
    o2 = reference(q2, k2, qd2, hn2, slopes, sb2, q_start)
    ref_grads = torch.autograd.grad(o2, ref_in, g.double())
    errs = [((a.double() - b).norm() / b.norm()).item() for a, b in zip([o, *grads], [o2, *ref_grads])]
    finite = all(bool(torch.isfinite(t).all()) for t in (o, *grads))
    ok = finite and all(e < TOLERANCE[dtype] for e in errs)
    names = ["o", "dq", "dk"] + (["dqd", "dĥ"] if diag is not None else []) + ["ds"]
    print(f"{str(dtype).replace('torch.', ''):9s} diag={str(diag):8s} Jq={Jq:5d} q_start={q_start:4d}  "
          + " ".join(f"{n} {e:.1e}" for n, e in zip(names, errs)) + ("  ok" if ok else "  FAIL"), flush=True)
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--length", type=int, default=1000, help="query length (ragged on purpose)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    K, d = args.heads, args.head_dim
    dtypes = [torch.float32, torch.bfloat16, torch.float16] if device.type == "cuda" else [torch.float32]
    ok = True
    for dtype in dtypes:
        for diag in ("shared", "per_head", None):
            ok &= check(device, dtype, diag, args.batch, K, args.length, 0, d, K * d, gen)
        ok &= check(device, dtype, "shared", args.batch, K, 7, args.length, d, K * d, gen)  # decoding: 7 new queries after a cache
    print("all ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
