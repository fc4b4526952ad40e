"""Every preset file in models/ loads through the real entry points; the 1.5B ones land on the paper's sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rla_ablate.cli import main
from rla_ablate.errors import UserError
from rla_ablate.models import FAMILIES, build_model, count_params, list_presets, load_preset
from rla_ablate.models.presets import PRESET_DIR

SCALES = ("tiny", "100m", "1.5b", "proxy-mqar", "proxy-lm")


def test_the_preset_grid_is_complete():
    assert sorted(list_presets()) == sorted(f"{s}-{f}" for s in SCALES for f in FAMILIES)
    assert {p.stem for p in PRESET_DIR.glob("*.yaml")} == set(list_presets())


@pytest.mark.parametrize("name", list_presets())
def test_preset_loads_and_names_its_family(name):
    cfg = load_preset(name)
    assert cfg.family == name.rsplit("-", 1)[1]
    assert load_preset(PRESET_DIR / f"{name}.yaml") == cfg


@pytest.mark.parametrize("family, paper", [("transformer", 1.51e9), ("sgla", 1.55e9), ("gdn", 1.55e9),
                                           ("rla", 1.55e9), ("rdn", 1.55e9)])
def test_1p5b_presets_match_the_paper(family, paper):
    cfg = load_preset(f"1.5b-{family}")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (2048, 8192, 16)
    if family == "transformer":
        assert (cfg.num_heads, cfg.num_kv_heads) == (32, 4)
    else:
        assert (cfg.num_heads, cfg.head_dim) == (16, 128)
    assert abs(count_params(cfg) / paper - 1) < 0.03


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_presets_train_a_step_on_cpu(family):
    torch.manual_seed(0)
    cfg = load_preset(f"tiny-{family}")
    # bytes and the end-of-document token of the embedded corpus
    assert cfg.vocab_size == 257
    model = build_model(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    loss = torch.nn.functional.cross_entropy(model(ids)[:, :-1].reshape(-1, cfg.vocab_size), ids[:, 1:].reshape(-1))
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(float(cfg.vocab_size))).item()) < 0.1


@pytest.mark.parametrize("task, low, high", [("mqar", 3e5, 5e5), ("lm", 8e6, 30e6)])
def test_proxy_presets_have_the_study_sizes_and_engaged_options(task, low, high):
    for family in FAMILIES:
        cfg = load_preset(f"proxy-{task}-{family}")
        assert low <= count_params(cfg) <= high, (family, count_params(cfg))
        # The 1.5B preset's per-unit init: init_std * sqrt(hidden) equal to 0.006 * sqrt(2048) within rounding.
        assert cfg.init_std * cfg.hidden_size ** 0.5 == pytest.approx(0.006 * 2048 ** 0.5, rel=0.01)
        if family != "transformer":
            assert cfg.conv_init == "identity"
        if family in ("rla", "rdn"):
            assert cfg.clip_mode == "relative"


def test_bad_preset_file_names_line_and_key(tmp_path: Path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("family: rla\nhidden_size: 64\nnum_layers: 2\nintermediate_size: 128\n"
                   "num_heads: 2\nhead_dim: 32\nqk_nrom: none\n")
    with pytest.raises(UserError) as err:
        load_preset(bad)
    text = str(err.value)
    assert f"{bad}:7:" in text and "qk_nrom" in text and "did you mean 'qk_norm'" in text

    bad.write_text("family: sgla\nhidden_size: 64\nnum_layers: 2\nintermediate_size: 128\n"
                   "num_heads: 2\nhead_dim: 32\ntied_gamma: true\n")
    with pytest.raises(UserError, match="only to residual families"):
        load_preset(bad)
    with pytest.raises(UserError, match="did you mean 'tiny-rla'"):
        load_preset("tiny-rl")


def test_models_command(capsys):
    assert main(["models", "--json", "--seq-len", "512"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["preset"] for r in rows] == list_presets()
    by_name = {r["preset"]: r for r in rows}
    assert by_name["1.5b-rla"]["state_elements_per_layer"] == 2 * by_name["1.5b-sgla"]["state_elements_per_layer"]
    assert by_name["tiny-rdn"]["params"] == count_params(load_preset("tiny-rdn"))
    assert main(["models", "tiny-rla", "1.5b-transformer"]) == 0
    table = capsys.readouterr().out
    assert "tiny-rla" in table and "1.5b-transformer" in table and "tiny-gdn" not in table
    assert main(["models", "tiny-rlx"]) == 2
    assert "did you mean 'tiny-rla'" in capsys.readouterr().err


def test_models_table_in_a_pipe_is_not_cut(capsys):
    from rla_ablate.commands.models import _human

    # stdout is not a terminal here, as in `rla-sweep models | less`: the table keeps its full columns
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert "non-emb" in out and _human(count_params(load_preset("1.5b-rla"))) in out


def test_a_sweep_or_job_file_given_for_a_preset_is_said_as_such(tmp_path, capsys):
    """`models FILE` or `train FILE` with a sweep file: one line saying what the file is, not every model key it
    lacks; a file of model keys with one missing still names that key."""
    sweep = Path(__file__).resolve().parents[1] / "sweeps" / "smoke.yaml"
    assert main(["models", str(sweep)]) == 2
    assert "smoke.yaml:1: is a sweep file (its models are under models:), not a model preset" in capsys.readouterr().err
    job = tmp_path / "job.yaml"
    job.write_text("model: tiny-rla\ntrain: {tokens: 4096}\n")
    with pytest.raises(UserError, match="is a job config .its model is under model:., not a model preset"):
        load_preset(job)
    partial = tmp_path / "partial.yaml"
    partial.write_text("hidden_size: 64\n")
    with pytest.raises(UserError, match="family"):
        load_preset(partial)
