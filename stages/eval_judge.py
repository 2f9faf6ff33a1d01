"""`eval.judge`: a judge PPO never optimised, scoring the eval's PPO, SFT and best-of-n replies (its scores are the
eval's gold, as the demo task's judge is; README, "Your own data and models"). A reward model trained on other pairs (kind model with its
MLflow URI), a language-model judge, a function or an endpoint, loaded here as a `RewardSet` of that one source."""

from __future__ import annotations

from pathlib import Path

from rlhf_lib.config import PipelineConfig
from rlhf_lib.config.rewards import RewardSource
from rlhf_lib.data.conversations import FILE_NAME as CONVERSATIONS
from rlhf_lib.data.conversations import read_conversations, reward_rendering
from rlhf_lib.devices import DTYPES
from rlhf_lib.model_dirs import load_scalar
from rlhf_lib.models import load_tokenizer, same_tokenizer
from rlhf_lib.rewards.combine import RewardSet
from rlhf_lib.rewards.judge import load_judge
from rlhf_lib.rewards.retokenize import RewardScorer
from stages.artifact_cache import download
from stages.models_io import judge_models
from stages.resolving import resolver


@resolver
def eval_judge_model(source: RewardSource) -> tuple[str | None, str]:
    """The local folder and the identity (for the eval's cache key and lineage) of eval.judge's model: a reward
    model's MLflow URI by the digest of its files, a judge model as `ppo.rewards`' judges; (None, "") for a function
    or an endpoint (their code and URL are in the key through the config)."""
    from stages.cache import given_model

    if source.kind == "judge":
        paths, ids = judge_models([source])
        return paths[source.name], ids[source.name]
    if source.kind == "model":
        given = given_model("eval-judge", source.model)
        return str(download(given.artifact_uri, given.digest)), f"{source.model} (mlflow:{given.digest})"
    return None, ""


def load_eval_judge(cfg: PipelineConfig, path: str | None, tokenizer, data_dir: Path, columns: dict,
                    device) -> RewardSet:
    """eval.judge as a RewardSet of its one source (weight 1) on `device`: it reads the policy's tokens, through its
    own tokenizer and chat template where it has them (the conversations the data stage recorded)."""
    source = cfg.eval.judge.model_copy(update={"weight": 1.0})
    frozen = DTYPES[cfg.resources.frozen_dtype]
    if source.kind == "model":
        model = load_scalar(Path(path), cfg.reward.trust_remote_code, frozen).to(device)
        own_tokenizer = load_tokenizer(path, trust_remote_code=cfg.reward.trust_remote_code)
        own = None if same_tokenizer(tokenizer, own_tokenizer) else own_tokenizer
        table = read_conversations(data_dir / CONVERSATIONS) if own is not None else {}
        rendering = reward_rendering(table, False, own, cfg.data.render, tokenizer) if own is not None else None
        return RewardSet([source], RewardScorer(model, tokenizer, own, rendering), tokenizer, columns,
                         cfg.eval.batch_size)
    judges = {}
    if source.kind == "judge":
        judges[source.name] = load_judge(source, path, frozen)
        judges[source.name].model.to(device)
    return RewardSet([source], None, tokenizer, columns, cfg.eval.batch_size, judges=judges)
