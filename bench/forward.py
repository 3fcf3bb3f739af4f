"""Forward and forward+backward time of SmolLM vs transformers' LlamaForCausalLM (sdpa),
same weights.

Runs alternate between the two models; the medians and the ratio smol / transformers are
printed (below 1.0: smol is faster).

    python bench/forward.py [--repeats 15] [--threads N] [--csv
    bench/results/forward.csv]
"""

import argparse

import torch
from common import alternate, write_csv

from smol import SmolConfig, SmolLM
from smol.reference import llama_twin


def pair(config: SmolConfig):
    ref = llama_twin(config, "sdpa")
    model = SmolLM(config)
    model.load_state_dict(ref.state_dict())
    return model, ref


def forward(model, ids, is_smol):
    with torch.no_grad():
        return model(ids)[0] if is_smol else model(ids).logits


def forward_backward(model, ids, is_smol):
    if is_smol:
        loss = model(ids, targets=ids.roll(-1, 1))[1]
    else:
        loss = model(ids, labels=ids).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--csv",
        help="also write the table to this CSV file (the Benchmarks page reads it)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    cases = [
        ("tiny", SmolConfig.preset("tiny"), (8, 256)),
        ("smollm2-135m", SmolConfig.preset("smollm2-135m"), (1, 128)),
    ]
    print(
        f"{'preset':<14}{'B x T':>10}{'pass':>18}"
        f"{'smol ms':>10}{'hf ms':>10}{'ratio':>8}"
    )
    table = []
    for name, config, (b, t) in cases:
        torch.manual_seed(0)
        model, ref = pair(config)
        ids = torch.randint(0, config.vocab_size, (b, t))
        for label, step, mode in (
            ("forward", forward, "eval"),
            ("forward+backward", forward_backward, "train"),
        ):
            for m in (model, ref):
                m.train(mode == "train")
            med, _ = alternate(
                {
                    "smol": lambda: step(model, ids, True),
                    "hf": lambda: step(ref, ids, False),
                },
                args.repeats,
            )
            ms = [f"{med['smol'] * 1e3:.1f}", f"{med['hf'] * 1e3:.1f}"]
            ratio = f"{med['smol'] / med['hf']:.2f}"
            print(
                f"{name:<14}{f'{b} x {t}':>10}{label:>18}"
                f"{ms[0]:>10}{ms[1]:>10}{ratio:>8}"
            )
            table.append([name, f"{b} x {t}", label, *ms, ratio])
    if args.csv:
        header = ["preset", "B x T", "pass", "smol (ms)", "transformers (ms)"]
        write_csv(args.csv, [*header, "smol / transformers"], table)


if __name__ == "__main__":
    main()
