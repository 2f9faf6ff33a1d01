"""`rlhf sweep`: the grid and listed points, the refusals before anything is submitted, and the ranking."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.main import main
from flows.sweep import parse_grid, parse_point, point_configs
from flows.sweep_runs import rank
from rlhf_lib.config import ConfigError


def test_commas_make_a_grid_and_single_values_apply_to_every_point():
    base, grid = parse_grid(["ppo.kl_coef=0.02,0.1", "ppo.iterations=4", "ppo.lr=1e-5,3e-5"])
    assert base == ["ppo.iterations=4"]
    assert grid == [{"ppo.kl_coef": "0.02", "ppo.lr": "1e-5"}, {"ppo.kl_coef": "0.02", "ppo.lr": "3e-5"},
                    {"ppo.kl_coef": "0.1", "ppo.lr": "1e-5"}, {"ppo.kl_coef": "0.1", "ppo.lr": "3e-5"}]
    # A YAML list or mapping is one value, never split.
    assert parse_grid(["ppo.rewards=[{name: rm, kind: model}, {name: x, kind: model}]"])[1] == [{}]


@given(st.dictionaries(st.sampled_from(["ppo.lr", "ppo.kl_coef", "ppo.epochs", "eval.temperature"]),
                       st.lists(st.integers(0, 99), min_size=1, max_size=4, unique=True), min_size=1))
def test_the_grid_is_the_product_of_the_values(axes):
    sets = [f"{k}={','.join(map(str, v))}" for k, v in axes.items()]
    base, grid = parse_grid(sets)
    swept = {k: v for k, v in axes.items() if len(v) > 1}
    assert len(grid) == math.prod(len(v) for v in swept.values())
    assert len({tuple(sorted(p.items())) for p in grid}) == len(grid)
    assert base == [s for s in sets if "," not in s]


def test_bad_items_are_refused_naming_them():
    for bad in (["ppo.kl_coef"], ["=1,2"], ["ppo.kl_coef=0.1,,0.2"], ["ppo.kl_coef=0.1,0.1"]):
        with pytest.raises(ConfigError, match="--set"):
            parse_grid(bad)
    assert parse_point("ppo.kl_coef=0.05 ppo.lr=2e-5") == {"ppo.kl_coef": "0.05", "ppo.lr": "2e-5"}
    with pytest.raises(ConfigError, match="--point"):
        parse_point("ppo.kl_coef")


def test_every_point_is_validated_before_anything_is_submitted():
    configs = point_configs("micro", None, ["ppo.iterations=3"], [{"ppo.kl_coef": "0.02"}, {"ppo.kl_coef": "0.3"}])
    assert [c.ppo.kl_coef for _, c in configs] == [0.02, 0.3]
    assert all(c.ppo.iterations == 3 for _, c in configs)
    assert configs[0][1].name != configs[1][1].name
    with pytest.raises(ConfigError, match=r"sweep point \{'ppo.kl_coef': '-1'\}.*ppo.kl_coef"):
        point_configs("micro", None, [], [{"ppo.kl_coef": "0.1"}, {"ppo.kl_coef": "-1"}])
    with pytest.raises(ConfigError, match="sft.lr.*would change the SFT or reward model"):
        point_configs("micro", None, [], [{"sft.lr": "0.1"}])
    with pytest.raises(ConfigError, match="nothing to sweep"):
        point_configs("micro", None, [], [])


def test_without_a_server_the_sweep_is_refused_unless_here(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))  # what the command sets, undone after
    assert main(["sweep", "ppo", "--preset", "micro", "--set", "ppo.kl_coef=0.1,0.2"]) == 2
    assert "rlhf/eval on a Prefect server" in capsys.readouterr().err


def _summary(win: float | None, status: str = "completed") -> dict:
    ev = {"win_rate_vs_sft": win, "win_rate_vs_sft_ci95": [0.1, 0.9], "kl_to_ref": 1.0, "reward_mean": 0.5,
          "response_length_mean": 9.0} if win is not None else None
    return {"status": status, "eval": ev, "mlflow_run_id": "r", "stages": {"ppo": {"model_uri": "models:/p/1"}}}


def test_points_are_ranked_best_first_and_failures_last():
    points = [{"ppo.kl_coef": "0.02"}, {"ppo.kl_coef": "0.1"}, {"ppo.kl_coef": "0.3"}]
    failed = {"status": "failed", "message": "flow run x ended CRASHED"}
    rows = rank(points, [_summary(0.4), failed, _summary(0.7)])
    assert [(r["rank"], r["ppo.kl_coef"], r["status"]) for r in rows] == [
        (1, "0.3", "completed"), (2, "0.02", "completed"), (3, "0.1", "failed")]
    assert rows[0]["metric"] == "win_rate_vs_sft" and rows[2]["message"] == "flow run x ended CRASHED"
