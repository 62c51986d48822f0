"""Training step time and GPU memory of one model under four optimizers, in one run on one
GPU host (issue: GPU trainers):

  torch-fused   torch.optim.AdamW(fused=True), state on the GPU (no offload)
  optstate      RemoteAdamW, the daemon on this host (shared memory), wait_in_forward
  torchao       torchao.optim.CPUOffloadOptimizer(AdamW, fused=True)
  deepspeed     DeepSpeed ZeRO-1 with offload_optimizer to the CPU (DeepSpeedCPUAdam)

Each runs the same model (a stack of MLP blocks, about --params parameters, float32), the
same batch, --warmup then --iters iterations of forward, backward, clip_grad_norm_(1.0),
step; reports the median iteration time, the peak GPU memory allocated and what that leaves
free, and the ratios against torchao (the target: optstate within 1.2x of torchao's time,
with at least the GPU memory it frees). A contender whose package is missing is reported
as not run, by name. Writes a JSON of everything to --out.

  python3 tests/gpu/bench_offload.py --target 127.0.0.1:PORT --out bench.json
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def make_model(params, width):
    per_block = 8 * width * width + 7 * width
    model = nn.Sequential(*[Block(width) for _ in range(max(1, params // per_block))])
    torch.manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p, std=0.02)
    return model.cuda()


def run(name, make_optimizer, args):
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = make_model(args.params, args.width)
    try:
        opt, step_fn = make_optimizer(model)
    except ImportError as e:
        return {"name": name, "run": False, "why": f"not installed: {e}"}
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(args.tokens, args.width, device="cuda", generator=gen)
    times = []
    for i in range(args.warmup + args.iters):
        start = time.perf_counter()
        loss = step_fn(model, opt, x)
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    free, total = torch.cuda.mem_get_info()
    out = {"name": name, "run": True, "params": sum(p.numel() for p in model.parameters()),
           "median_s": statistics.median(times), "min_s": min(times),
           "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
           "free_bytes_after": free, "total_bytes": total, "loss": float(loss)}
    close = getattr(opt, "close", None)
    if close is not None:
        close()
    del opt, model
    return out


def plain_step(model, opt, x):
    opt.zero_grad(set_to_none=True)
    loss = model(x).float().square().mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.detach()


def torch_fused(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True), plain_step


def optstate_remote(args):
    def make(model):
        from optstate.torch import RemoteAdamW
        opt = RemoteAdamW(model.named_parameters(), lr=1e-4, target=args.target,
                          name_prefix=f"bench-offload-{os.getpid()}/", delete_on_close=True)
        opt.wait_in_forward(model)

        def step(model, opt, x):
            opt.zero_grad(set_to_none=True)
            loss = model(x).float().square().mean()
            loss.backward()
            opt.clip_grad_norm_(1.0)  # the daemon's grad_scale: the host copies stay valid
            opt.step()
            return loss.detach()
        return opt, step
    return make


def torchao_offload(model):
    from torchao.optim import CPUOffloadOptimizer
    return CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4,
                               fused=True), plain_step


def deepspeed_offload(model):
    import deepspeed
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
              "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu",
                                                                       "pin_memory": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)

    def step(_model, engine, x):
        loss = engine(x).float().square().mean()
        engine.backward(loss)
        engine.step()
        return loss.detach()
    return engine, step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True, help="optstated's host:port on this host")
    parser.add_argument("--params", type=int, default=1_200_000_000)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default="bench_offload.json")
    parser.add_argument("--only", default="torch-fused,optstate,torchao,deepspeed")
    args = parser.parse_args()
    contenders = {"torch-fused": torch_fused, "optstate": optstate_remote(args),
                  "torchao": torchao_offload, "deepspeed": deepspeed_offload}
    results = []
    for name in args.only.split(","):
        try:
            results.append(run(name, contenders[name], args))
        except Exception as e:  # a contender that fails is reported, the others still run
            results.append({"name": name, "run": False, "why": f"{type(e).__name__}: {e}"})
        print(json.dumps(results[-1]), flush=True)
    by_name = {r["name"]: r for r in results if r["run"]}
    print(f"\n{'optimizer':12} {'median s':>9} {'peak GiB':>9} {'free GiB':>9}")
    for r in results:
        if r["run"]:
            print(f"{r['name']:12} {r['median_s']:9.4f} {r['peak_allocated_bytes'] / 2**30:9.2f} "
                  f"{r['free_bytes_after'] / 2**30:9.2f}")
        else:
            print(f"{r['name']:12} NOT RUN: {r['why']}")
    if "optstate" in by_name and "torchao" in by_name:
        o, t = by_name["optstate"], by_name["torchao"]
        ratio = o["median_s"] / t["median_s"]
        print(f"optstate / torchao step time: {ratio:.3f} (target <= 1.2); peak GPU memory "
              f"{o['peak_allocated_bytes'] / 2**30:.2f} vs {t['peak_allocated_bytes'] / 2**30:.2f} GiB")
    with open(args.out, "w") as f:
        json.dump({"results": results, "device": torch.cuda.get_device_name(),
                   "argv": sys.argv}, f, indent=1)


if __name__ == "__main__":
    main()
