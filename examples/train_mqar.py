"""Train a small Gated DeltaNet model on multi-query associative recall (MQAR)
with gdn, then answer recall queries by cached decode.

MQAR: a sequence starts with key-value pairs (k1 v1 k2 v2 ...) and goes on
with queries, keys seen before; at each query the model must predict that
key's value. Batches are drawn on the fly from --seed, so two runs with the
same seed see the same data. The model: token embedding, --layers blocks of
gdn.GatedDeltaNet (short conv, gated RMSNorm) and a SiLU MLP with pre-norms,
a final norm and the embedding as output head. --kernel torch runs the same
model, parameters and data on gdn.torch_ref (plain torch ops), to compare.

    python examples/train_mqar.py --steps 300 --kernel gdn
    python examples/train_mqar.py --steps 300 --kernel both --plot docs/mqar.png

Prints progress (loss, recall accuracy, tokens/s), a table at the end, and a
few solved queries answered one token at a time through the decode step,
with the largest difference between those logits and a full prefill's.
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import gdn

try:
    from tqdm import tqdm
except ImportError:   # a plain loop without a bar
    tqdm = None


def mqar_batch(gen, batch, seq_len, n_keys, n_values, device):
    """Inputs [batch, seq_len] and targets (-100 where nothing is asked)."""
    pairs = seq_len // 4
    keys = torch.stack([torch.randperm(n_keys, generator=gen)[:pairs] for _ in range(batch)]) + 1
    values = torch.randint(0, n_values, (batch, pairs), generator=gen) + 1 + n_keys
    x = torch.zeros(batch, seq_len, dtype=torch.long)
    y = torch.full((batch, seq_len), -100, dtype=torch.long)
    x[:, 0:2 * pairs:2], x[:, 1:2 * pairs:2] = keys, values
    n_q = seq_len - 2 * pairs
    pick = torch.randint(0, pairs, (batch, n_q), generator=gen)
    x[:, 2 * pairs:] = keys.gather(1, pick)
    y[:, 2 * pairs:] = values.gather(1, pick)
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self, d, heads, head_dim, kernel, idx):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.mix = gdn.GatedDeltaNet(d, heads, heads, head_dim, head_dim, 4, layer_idx=idx, kernel=kernel)
        self.up, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x, cache=None):
        x = x + self.mix(self.n1(x), cache=cache)
        return x + self.down(F.silu(self.up(self.n2(x))))


class Model(nn.Module):
    def __init__(self, vocab, d, layers, heads, head_dim, kernel):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, head_dim, kernel, i) for i in range(layers))
        self.norm = nn.RMSNorm(d)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, x, cache=None):
        h = self.emb(x)
        for blk in self.blocks:
            h = blk(h, cache)
        return self.norm(h) @ self.emb.weight.T   # tied head


def train(args, kernel):
    """Returns (losses, accuracies, tokens/s, model)."""
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(args.seed)
    vocab = 1 + args.keys + args.values
    model = Model(vocab, args.d_model, args.layers, args.heads, args.head_dim, kernel).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + 1)
    losses, accs = [], []
    bar = tqdm(range(args.steps), desc=kernel, leave=False) if tqdm and not args.quiet else range(args.steps)
    t0, tokens = time.perf_counter(), 0
    for step in bar:
        x, y = mqar_batch(gen, args.batch, args.seq_len, args.keys, args.values, dev)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        asked = y != -100
        acc = (logits.argmax(-1)[asked] == y[asked]).float().mean().item()
        losses.append(loss.item())
        accs.append(acc)
        tokens += x.numel()
        if tqdm and not args.quiet:
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}",
                            tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    return losses, accs, tokens / (time.perf_counter() - t0), model


@torch.no_grad()
def generate_check(args, model, n_show=3):
    """Cached decode (the decode step) against a full prefill on fresh queries: max |logit diff| / max |logit|."""
    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed + 2)
    x, y = mqar_batch(gen, 4, args.seq_len, args.keys, args.values, dev)
    full = model(x).float()
    cache = gdn.GatedDeltaNetCache()
    half = args.seq_len // 2
    steps = [model(x[:, :half], cache=cache).float()]
    for t in range(half, args.seq_len):
        steps.append(model(x[:, t:t + 1], cache=cache).float())
    dec = torch.cat(steps, 1)
    err = ((dec - full).norm() / full.norm()).item()
    asked = (y[0] != -100).nonzero().flatten()[:n_show].tolist()
    examples = [(x[0, t].item(), y[0, t].item(), dec[0, t].argmax().item()) for t in asked]
    return err, examples


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--kernel", default="gdn", choices=["gdn", "torch", "both"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--keys", type=int, default=32)
    p.add_argument("--values", type=int, default=32)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="PNG of the loss and accuracy curves (needs matplotlib)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    kernels = ["gdn", "torch"] if args.kernel == "both" else [args.kernel]
    runs = {k: train(args, k) for k in kernels}
    chance = 1.0 / args.values
    print(f"\nMQAR seq_len {args.seq_len}, {args.seq_len // 4} pairs, {args.keys} keys, {args.values} values "
          f"(chance {chance:.3f}); {args.layers} layers d_model {args.d_model}, {args.steps} steps, "
          f"{args.device} {args.dtype}")
    print(f"{'kernel':8s} {'first loss':>10s} {'last loss':>10s} {'last acc':>9s} {'tokens/s':>10s}")
    for k, (losses, accs, tps, _) in runs.items():
        tail = max(1, len(accs) // 10)
        print(f"{k:8s} {losses[0]:10.4f} {sum(losses[-tail:]) / tail:10.4f} {sum(accs[-tail:]) / tail:9.3f} "
              f"{tps:10.0f}")
    if len(runs) == 2:
        a, b = runs["gdn"][0], runs["torch"][0]
        n = min(len(a), 20)
        dif = max(abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n]))
        print(f"largest relative loss difference over the first {n} steps: {dif:.2e}")
    for k, (_, _, _, model) in runs.items():
        if k == "gdn":
            err, ex = generate_check(args, model)
            print(f"cached decode vs prefill logits: relative difference {err:.2e}")
            for key, want, got in ex:
                print(f"  query key {key}: value {want}, answered {got} {'ok' if want == got else 'wrong'}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
        for k, (losses, accs, _, _) in runs.items():
            ax1.plot(losses, label=k, lw=1.2, ls="-" if k == "gdn" else "--")
            ax2.plot(accs, label=k, lw=1.2, ls="-" if k == "gdn" else "--")
        ax1.set(xlabel="step", ylabel="loss", title="MQAR training loss")
        ax2.set(xlabel="step", ylabel="recall accuracy", title="recall accuracy")
        ax2.axhline(chance, color="gray", lw=0.8, ls=":")
        ax1.legend(), ax2.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")
    return runs


if __name__ == "__main__":
    main()
