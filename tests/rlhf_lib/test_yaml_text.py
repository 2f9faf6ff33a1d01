"""Config files are read strictly (rlhf_lib/config/yaml_text.py): each refusal is one ConfigError naming the file and
line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhf_lib.config import ConfigError, build_config
from rlhf_lib.config.yaml_text import MAX_BYTES, MAX_NODES, parse_yaml, read_yaml


def _write(tmp_path, data: bytes, name: str = "c.yaml"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_duplicate_key_is_named_with_both_lines(tmp_path):
    path = _write(tmp_path, b"ppo:\n  lr: 1.0e-5\n  kl_coef: 0.1\n  lr: 3.0e-6\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4:3: invalid YAML: duplicate key 'lr' \(first on line 2\)$"):
        read_yaml(path)


def test_a_syntax_error_is_one_line_with_line_and_column():
    with pytest.raises(ConfigError, match=r"^x.yaml:2:5: invalid YAML: mapping values are not allowed here$"):
        parse_yaml("a: 1\nb: c: d\n", "x.yaml")


def test_the_same_key_in_two_sections_is_fine(tmp_path):
    assert read_yaml(_write(tmp_path, b"sft:\n  lr: 1\nreward:\n  lr: 2\n")) == {"sft": {"lr": 1}, "reward": {"lr": 2}}


def test_an_undecodable_file_is_named_with_its_line(tmp_path):
    path = _write(tmp_path, "name: a\nppo:\n  lr: 1\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"c.yaml:4: not UTF-8 text \(byte 0xe9"):
        read_yaml(path)


def test_a_nul_byte_and_an_oversized_file_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml:2: a NUL byte"):
        read_yaml(_write(tmp_path, b"name: a\nppo: \x00\n"))
    with pytest.raises(ConfigError, match=r"big.yaml: 1,048,577 bytes; a config file is at most 1,048,576"):
        read_yaml(_write(tmp_path, b"#" * (MAX_BYTES + 1), "big.yaml"))


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    # 9 levels of 10 aliases each: 10^9 values once expanded, from a few hundred bytes.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = _write(tmp_path, "\n".join(lines).encode())
    with pytest.raises(ConfigError, match=f"expands to more than {MAX_NODES:,} values"):
        read_yaml(path)


def test_a_recursive_alias_is_refused():
    with pytest.raises(ConfigError, match="expands to more than"):
        parse_yaml("a: &a [1, *a]\n", "x.yaml")


def test_a_few_aliases_still_work():
    assert parse_yaml("base: &b {lr: 1}\nsft: *b\nreward: *b\n", "x.yaml") == {
        "base": {"lr": 1}, "sft": {"lr": 1}, "reward": {"lr": 1}}


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e999"])
def test_non_finite_numbers_are_refused(value):
    with pytest.raises(ConfigError, match="sft.lr.*finite number"):
        build_config([], [f"sft.lr={value}"])
    with pytest.raises(ConfigError, match="ppo.kl_coef.*finite number"):
        build_config([("run.yaml", {"ppo": {"kl_coef": float(value.replace(".inf", "inf").replace(".nan", "nan"))}})])


@given(st.dictionaries(st.text("abcdefgh_", min_size=1, max_size=6), st.integers() | st.text(max_size=8),
                       max_size=8))
def test_any_plain_mapping_reads_back(mapping):
    import yaml

    assert parse_yaml(yaml.safe_dump(mapping), "x.yaml") == mapping
