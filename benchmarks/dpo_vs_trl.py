#!/usr/bin/env python3
"""DPO's loss and rewards against TRL 1.12's `DPOTrainer`, on the same tiny causal LMs and the same batch.

    python benchmarks/dpo_vs_trl.py             # builds benchmarks/.trl-venv first if it is missing

This side (the project's venv) trains a byte-level BPE tokenizer, builds two 2-layer GPT-2s from transformers' config
class (the policy, seed 0, and the reference, seed 1; no dropout), saves them with the tokenizer and the batch
(the pairs' texts and the token ids `rlhf_lib.dpo.encode_pairs` gives them) to a temporary directory, then runs
`benchmarks/trl_dpo_side.py` in the TRL venv, which reads only those files: one `DPOTrainer.compute_loss` per case
on a batch of TRL's own collator, fed the same token ids. This side scores the batch with `rlhf_lib.dpo`
(`pair_logps`, `dpo_loss`, `step_stats`). Cases: sigmoid, sigmoid with label smoothing 0.1 (cDPO; TRL 1.12's
sigmoid ignores label smoothing, so its side is 2(1−ε)·sigmoid − (1−2ε)·robust, see trl_dpo_side.py) and ipo, at
β 0.1 and 0.5. The table gives both losses and the absolute differences of the loss and of TRL's metrics; PASS when
every one is ≤ 1e-6 and TRL's own tokenisation of the texts gave the same ids (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_VERSION = "1.12.0"
TOLERANCE = 1e-6
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected")
PAIRS = (  # (prompt, chosen, rejected): replies of different lengths, so padding and IPO's per-token mean matter
    ("\n\nHuman: tell me about topic 3\n\nAssistant:", " Sure, topic 3 is nice. Thanks!", " No."),
    ("\n\nHuman: tell me about topic 17\n\nAssistant:", " Topic 17 is nice.", " Sure, topic 4 is nice. Thanks!"),
    ("\n\nHuman: what is topic 8?\n\nAssistant:", " Topic 8 is nice. Thanks!", " Thanks! Thanks! Thanks!"),
    ("\n\nHuman: hi\n\nAssistant:", " Sure.", " tell me about topic 5"),
)


def cases(betas: tuple[float, ...] = (0.1, 0.5)) -> list[dict]:
    """The compared settings: per β, sigmoid, sigmoid with label smoothing 0.1, ipo."""
    return [{"name": f"{name} β={beta}", "loss_type": loss_type, "beta": beta, "label_smoothing": eps}
            for beta in betas
            for name, loss_type, eps in (("sigmoid", "sigmoid", 0.0), ("sigmoid ε=0.1", "sigmoid", 0.1),
                                         ("ipo", "ipo", 0.0))]


def trl_rows(encoded: list[tuple[tuple[list[int], int], tuple[list[int], int]]]) -> list[dict]:
    """This project's encoded pairs ((ids, prompt tokens) of chosen and of rejected) as the rows TRL's preference
    collator takes: {"prompt_ids", "chosen_ids", "rejected_ids"}. Both rows of a pair must share their prompt.

    >>> trl_rows([(([1, 2, 3, 0], 2), ([1, 2, 4, 5, 0], 2))])
    [{'prompt_ids': [1, 2], 'chosen_ids': [3, 0], 'rejected_ids': [4, 5, 0]}]
    """
    rows = []
    for (c_ids, c_n), (r_ids, r_n) in encoded:
        if c_ids[:c_n] != r_ids[:r_n]:
            raise ValueError("a pair's chosen and rejected rows differ in their prompt tokens")
        rows.append({"prompt_ids": list(c_ids[:c_n]), "chosen_ids": list(c_ids[c_n:]),
                     "rejected_ids": list(r_ids[r_n:])})
    return rows


def differences(ours: dict[str, float], trl: dict[str, float]) -> dict[str, float]:
    """|ours − TRL| of the loss and of each metric.

    >>> differences({"loss": 0.5, "rewards/chosen": 0.25}, {"loss": 0.25, "rewards/chosen": 0.25})
    {'loss': 0.25, 'rewards/chosen': 0.0}
    """
    return {k: abs(ours[k] - trl[k]) for k in ours}


def table(names: list[str], ours: dict[str, dict], trl: dict[str, dict], tokens_identical: bool,
          tolerance: float = TOLERANCE) -> tuple[str, bool]:
    """The printed verdict line and table (markdown), and whether every difference is within `tolerance` with
    identical tokens."""
    lines = ["| case | loss ours | loss TRL | Δ loss | Δ rew. chosen | Δ rew. rejected | Δ margins | Δ acc. | "
             "Δ logps | |", "|---|---|---|---|---|---|---|---|---|---|"]
    passed = tokens_identical
    for name in names:
        d = differences(ours[name], trl[name])
        ok = max(d.values()) <= tolerance
        passed = passed and ok
        lines.append(f"| {name} | {ours[name]['loss']:.7f} | {trl[name]['loss']:.7f} | {d['loss']:.1e} | "
                     f"{d['rewards/chosen']:.1e} | {d['rewards/rejected']:.1e} | {d['rewards/margins']:.1e} | "
                     f"{d['rewards/accuracies']:.1e} | {max(d['logps/chosen'], d['logps/rejected']):.1e} | "
                     f"{'ok' if ok else 'FAIL'} |")
    verdict = (f"{'PASS' if passed else 'FAIL'}: every |ours − TRL| ≤ {tolerance:g}: {passed}; TRL's own "
               f"tokenisation gave the same ids: {tokens_identical}")
    return "\n".join([verdict, *lines]), passed


def trl_python(venv: Path) -> Path:
    """The TRL venv's interpreter, the venv built by setup_trl_venv.sh when missing; checks TRL's version."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"building the TRL venv {venv} (benchmarks/setup_trl_venv.sh)", file=sys.stderr)
        # the script ends by diffing its pip freeze with the PPO baseline's; a drift of an unpinned dependency
        # fails that diff (and the script) but not this benchmark, which checks TRL's version itself
        subprocess.run(["bash", str(HERE / "setup_trl_venv.sh"), str(venv)], check=False)
    got = subprocess.run([str(python), "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True)
    if got.returncode != 0 or got.stdout.strip() != TRL_VERSION:
        raise SystemExit(f"{venv}: expected trl {TRL_VERSION}, got {got.stdout.strip() or got.stderr[-500:]}")
    return python


def write_inputs(directory: Path, seeds: tuple[int, int] = (0, 1)) -> dict:
    """The tokenizer, policy/ and reference/ and batch.json in `directory`; returns the batch."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlhf_lib.data.records import PairExample
    from rlhf_lib.dpo import encode_pairs
    from rlhf_lib.models import train_tokenizer

    corpus = [f"\n\nHuman: tell me about topic {i}\n\nAssistant: Sure, topic {i} is nice. Thanks!" for i in range(50)]
    tokenizer = train_tokenizer(corpus, vocab_size=300)
    tokenizer.save_pretrained(directory / "tokenizer")
    for name, seed in zip(("policy", "reference"), seeds, strict=True):
        torch.manual_seed(seed)
        config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2,
                            bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
        GPT2LMHeadModel(config).save_pretrained(directory / name)
    pairs = [PairExample(p, c, r, None) for p, c, r in PAIRS]
    encoded = encode_pairs(tokenizer, pairs, max_length=64)
    batch = {"pairs": [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS], "rows": trl_rows(encoded),
             "cases": cases()}
    (directory / "batch.json").write_text(json.dumps(batch))
    return batch


def score_ours(directory: Path, batch: dict) -> dict[str, dict[str, float]]:
    """`rlhf_lib.dpo` on the batch's rows, with the models as the TRL side reads them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_lib.dpo import dpo_loss, pair_logps, response_tokens, step_stats

    tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer")
    encoded = [((r["prompt_ids"] + r["chosen_ids"], len(r["prompt_ids"])),
                (r["prompt_ids"] + r["rejected_ids"], len(r["prompt_ids"]))) for r in batch["rows"]]
    n, cpu = len(encoded), torch.device("cpu")
    policy, reference = (AutoModelForCausalLM.from_pretrained(directory / name, dtype=torch.float32)
                         for name in ("policy", "reference"))
    policy_c, policy_r = pair_logps(policy, encoded, tokenizer.pad_token_id, n, cpu)
    ref_c, ref_r = pair_logps(reference, encoded, tokenizer.pad_token_id, n, cpu)
    tokens_c, tokens_r = response_tokens(encoded)
    out = {}
    for case in batch["cases"]:
        losses, chosen, rejected = dpo_loss(policy_c, policy_r, ref_c, ref_r, case["beta"], case["loss_type"],
                                            case["label_smoothing"], tokens_c, tokens_r)
        out[case["name"]] = step_stats(losses, chosen, rejected, policy_c, policy_r)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=HERE / ".trl-venv", help="the TRL venv (built when missing)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    python = trl_python(args.venv)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        batch = write_inputs(directory)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
        proc = subprocess.run([str(python), str(HERE / "trl_dpo_side.py"), str(directory)], cwd=tmp, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the TRL side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        trl = json.loads(proc.stdout.strip().splitlines()[-1])
        ours = score_ours(directory, batch)
    text, passed = table([c["name"] for c in batch["cases"]], ours, trl["results"], trl["tokens_identical"])
    print(f"trl {trl['trl_version']}, torch {trl['torch_version']}; {len(PAIRS)} pairs, 2-layer GPT-2 "
          f"(vocabulary 300), policy seed 0, reference seed 1")
    print(text)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
