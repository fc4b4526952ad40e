"""YAML loading with line numbers and validation errors that name file, line, key and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict

from rla_ablate.config import load_yaml, validate
from rla_ablate.config.yamlio import load_yaml_text
from rla_ablate.errors import UserError


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    learning_rate: float = 3e-4
    schedule: Literal["cosine", "linear"] = "cosine"


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    train: Inner = Inner()
    seeds: list[int] = [0]


def test_lines_are_remembered_for_nested_keys():
    located = load_yaml_text("name: x\ntrain:\n  learning_rate: 0.1\nseeds:\n  - 1\n  - 2\n", "f.yaml")
    assert located.line(("train", "learning_rate")) == 3
    assert located.line(("seeds", 1)) == 6
    # an unknown deeper key points at its deepest known parent
    assert located.line(("train", "nope")) == 2


def test_unknown_key_names_file_line_key_and_did_you_mean():
    located = load_yaml_text("name: x\ntrain:\n  learnig_rate: 0.1\n", "sweep.yaml")
    with pytest.raises(UserError) as info:
        validate(Outer, located)
    msg = str(info.value)
    assert msg.startswith("sweep.yaml:3: train.learnig_rate: unknown key 'learnig_rate'")
    assert "did you mean 'learning_rate'?" in msg
    assert "allowed: learning_rate, schedule" in msg


def test_literal_error_lists_allowed_values():
    located = load_yaml_text("name: x\ntrain:\n  schedule: cosin\n", "s.yaml")
    with pytest.raises(UserError) as info:
        validate(Outer, located)
    msg = str(info.value)
    assert "s.yaml:3: train.schedule:" in msg and "allowed: cosine, linear" in msg and "did you mean 'cosine'" in msg


def test_wrong_type_and_missing_key_reported_together():
    located = load_yaml_text("train:\n  learning_rate: fast\n", "s.yaml")
    with pytest.raises(UserError) as info:
        validate(Outer, located)
    msg = str(info.value)
    assert "2 problems" in msg
    assert "s.yaml:2: train.learning_rate:" in msg and "'fast'" in msg
    assert "name: Field required" in msg


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ntrain: [1, 2\nseeds: 3\n")
    with pytest.raises(UserError) as info:
        load_yaml(path)
    assert str(info.value).startswith(f"{path}:") and "malformed YAML" in str(info.value)


def test_unsafe_yaml_tags_are_refused():
    with pytest.raises(UserError, match="malformed YAML"):
        load_yaml_text("name: !!python/object/apply:os.system ['true']\n", "evil.yaml")


def test_cli_prints_user_errors_without_traceback_and_exits_2(tmp_path):
    # `rla-sweep` with an unknown command is an argparse error (exit 2, no traceback)
    proc = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "no-such-command"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_duplicate_key_names_both_lines():
    with pytest.raises(UserError) as info:
        load_yaml_text("name: x\ntrain:\n  learning_rate: 0.1\n  schedule: linear\n  learning_rate: 0.2\n", "s.yaml")
    msg = str(info.value)
    assert msg.startswith("s.yaml:5: train.learning_rate: duplicate key 'learning_rate'")
    assert "line 3" in msg and "line 5" in msg
    # the same key in two different mappings is fine
    load_yaml_text("a: {x: 1}\nb: {x: 2}\n", "s.yaml")


@pytest.mark.parametrize("text, value", [("1e5", 1e5), ("1E5", 1e5), ("-2e-3", -2e-3), ("1.5e5", 1.5e5),
                                         ("3.0e-3", 3e-3), ("+1e+2", 100.0)])
def test_scientific_notation_without_a_dot_is_a_number(text, value):
    assert load_yaml_text(f"v: {text}\n", "s.yaml").data["v"] == value
    # strings that merely contain an e stay strings
    assert load_yaml_text("v: e5\nw: 1e\n", "s.yaml").data == {"v": "e5", "w": "1e"}


def test_scientific_tokens_validate_as_int():
    class Train(BaseModel):
        tokens: int

    assert validate(Train, load_yaml_text("tokens: 1e5\n", "s.yaml")).tokens == 100000


def test_non_utf8_file_is_a_user_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: x\ndescription: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError) as info:
        load_yaml(path)
    assert "not UTF-8" in str(info.value) and f"{path}:2:" in str(info.value)


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Literal["alpha", "beta"]


class Listed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    names: list[Entry | Literal["alpha", "beta"]] = []
    share: float | Literal["auto"] = 0.0


@pytest.mark.parametrize("text, where, says", [
    # a name that is neither a mapping nor allowed: one problem, not one per member of the union
    ("names:\n  - alpa\n", "s.yaml:2: names.0: ", "unknown name 'alpa' (did you mean 'alpha'?); allowed: alpha, beta"),
    ("names:\n  - {name: alpa}\n", "s.yaml:2: names.0.name: ", "'alpa' is not allowed (did you mean 'alpha'?); allowed: alpha, beta"),
    ("share: lots\n", "s.yaml:1: share: ", "Input should be a valid number or 'auto' (got 'lots')"),
    # a long value (a text file read as YAML): its start and its length, not the whole of it
    ("share: " + "word " * 400 + "\n", "s.yaml:1: share: ",
     "Input should be a valid number or 'auto' (got '" + ("word " * 12)[:59] + "... (1,999 characters))"),
])
def test_a_value_that_fits_no_member_of_a_union_is_one_problem(text, where, says):
    with pytest.raises(UserError) as info:
        validate(Listed, load_yaml_text(text, "s.yaml"))
    msg = str(info.value)
    assert msg.startswith(where + says), msg
    assert "problems" not in msg and "literal[" not in msg and "Entry" not in msg


def test_validator_messages_have_no_pydantic_prefix():
    from rla_ablate.sweep.schema import SweepConfig

    with pytest.raises(UserError) as info:
        validate(SweepConfig, load_yaml_text("name: x\nmodels: [{preset: a}]\nseeds: [0, 1, 0, 1, 2]\n", "s.yaml"))
    assert str(info.value) == "s.yaml:3: seeds: seeds 0, 1 listed more than once; each seed runs once per job"
    with pytest.raises(UserError) as info:   # a grid value twice is one job listed twice: said, not dropped
        validate(SweepConfig, load_yaml_text("name: x\nmodels: [{preset: a}]\ngrid: {model.clip: [0.5, 0.5, 1]}\n",
                                             "s.yaml"))
    assert str(info.value) == "s.yaml:3: grid: 'model.clip' lists 0.5 more than once; each value runs once"
    with pytest.raises(UserError) as info:   # 1 and 1.0 are one value to a job's hash: one job, said as well
        validate(SweepConfig, load_yaml_text("name: x\nmodels: [{preset: a}]\ngrid: {train.lr: [1, 2.0e-3, 1.0]}\n",
                                             "s.yaml"))
    assert str(info.value) == "s.yaml:3: grid: 'train.lr' lists 1 (as 1 and 1.0) more than once; each value runs once"
    # True is not 1, nor "1" 1: distinct values
    validate(SweepConfig, load_yaml_text("name: x\nmodels: [{preset: a}]\ngrid: {model.output_gates: [true, 1]}\n",
                                         "s.yaml"))
    # seeds: sets train.seed over any point's value, so a swept train.seed would run the same jobs again
    for section in ("grid", "zip"):
        with pytest.raises(UserError) as info:
            validate(SweepConfig, load_yaml_text(f"name: x\nmodels: [{{preset: a}}]\n{section}: {{train.seed: [0, 1]}}\n",
                                                 "s.yaml"))
        assert str(info.value) == (f"s.yaml:3: {section}: 'train.seed' is not swept here: list the seeds under "
                                   "'seeds:' (seeds: [0, 1]); each job runs once per seed")
    # ... and so would a base train.seed: every job's seed comes from seeds:, whatever base says
    with pytest.raises(UserError) as info:
        validate(SweepConfig, load_yaml_text("name: x\nmodels: [{preset: a}]\nbase:\n  train: {seed: 5}\n",
                                             "s.yaml"))
    assert str(info.value) == ("s.yaml:3: base: 'train.seed' is not set in base: list the seeds under 'seeds:' "
                               "(seeds: [5]); each job runs once per seed")
    # an ablation listed twice, by name or as a mapping: the same jobs again, or families that contradict
    with pytest.raises(UserError) as info:
        validate(SweepConfig, load_yaml_text("name: x\nmodels: [{preset: a}]\n"
                                             "ablations: [no_clip, {name: no_clip, families: [rdn]}]\n", "s.yaml"))
    assert str(info.value) == ("s.yaml:3: ablations: ablation no_clip listed more than once; list each once "
                               "(with families: [...] to limit it)")


def test_validation_message_leaves_out_the_key_it_is_reported_at():
    from pydantic import ValidationError

    from rla_ablate.config.yamlio import user_loc, validation_message
    from rla_ablate.data import EvalConfig

    class Job(BaseModel):
        model_config = ConfigDict(extra="forbid")
        train: Inner = Inner()
        eval: list[EvalConfig] = []

    with pytest.raises(ValidationError) as info:
        Job.model_validate({"eval": [{"name": "v", "data": {"kind": "stdlib", "split": "valid"}}]})
    # the discriminated union's tag ('stdlib') is not a key the user wrote
    assert user_loc(info.value, Job) == ("eval", 0, "data", "split")
    msg = validation_message(info.value, Job, at="eval.0.data.split")
    assert msg.startswith("'valid' is not allowed (did you mean 'validation'?); allowed: train, validation"), msg
    # a misspelt required key is where the problem is, not the key it stands for (reported missing first)
    with pytest.raises(ValidationError) as info:
        Job.model_validate({"eval": [{"nme": "v", "data": {"kind": "stdlib"}}]})
    assert info.value.errors()[0]["loc"] == ("eval", 0, "name")
    assert user_loc(info.value, Job) == ("eval", 0, "nme")
    msg = validation_message(info.value, Job, prefix="base.", at="base.eval.0.nme")
    assert msg.startswith("unknown key 'nme' (did you mean 'name'?)"), msg


@pytest.mark.parametrize("text, where, says", [
    ("name: x\nseeds: [0, 1\nother: 2\n", "s.yaml:2: seeds: ", "the '[' opened here is not closed"),
    ("name: x\ntrain:\n  lr: {a: 1\n  b: 2\n", "s.yaml:3: train.lr: ", "the '{' opened here is not closed"),
    ("name: x\nlist:\n  - a\n  - [b, c\n", "s.yaml:4: list.1: ", "the '[' opened here is not closed"),
    ("name: 'x\nother: 2\n", "s.yaml:1: name: ", "the \"'\" opened here is not closed"),
])
def test_an_unclosed_bracket_is_reported_where_it_opens(text, where, says):
    with pytest.raises(UserError) as info:
        load_yaml_text(text, "s.yaml")
    assert str(info.value).startswith(where + "malformed YAML: " + says), str(info.value)


def test_a_folder_is_not_a_yaml_file(tmp_path):
    (tmp_path / "a.yaml").write_text("name: x\n")
    with pytest.raises(UserError) as info:
        load_yaml(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a folder, not a file; expected a YAML file (it holds a.yaml)"


def test_yaml_true_or_false_is_never_read_as_a_number(tmp_path):
    """Pydantic would read `tokens: true` as a budget of 1 token; a number field refuses a bool, at its line."""
    import pydantic

    from rla_ablate.errors import UserError
    from rla_ablate.models import ModelConfig
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.train.config import TrainConfig

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodels:\n  - preset: tiny-rla\nbase:\n  train:\n    tokens: true\n")
    with pytest.raises(UserError, match=r"s.yaml:6: base.train.tokens: true is not a number"):
        load_sweep(path)
    with pytest.raises(pydantic.ValidationError, match="false is not a number"):
        TrainConfig(lr=False)
    from rla_ablate.models import load_preset

    tiny = load_preset("tiny-rla").model_dump()
    with pytest.raises(pydantic.ValidationError, match="true is not a number"):
        ModelConfig(**{**tiny, "num_layers": True})
    # bool fields take bools; numbers written as YAML strings still read as numbers
    assert ModelConfig(**{**tiny, "output_gates": False}).output_gates is False
    assert TrainConfig(lr="1e-3").lr == 1e-3


def test_an_infinite_or_nan_number_is_refused_at_its_line(tmp_path):
    """`lr: .inf` trained a run of skipped steps to a NaN model that ended "finished": every number of the train,
    model, data and sweep configs is finite."""
    import pydantic

    from rla_ablate.data.config import MQARData
    from rla_ablate.errors import UserError
    from rla_ablate.sweep.expand import load_sweep
    from rla_ablate.train.config import TrainConfig

    path = tmp_path / "s.yaml"
    for key, value in (("lr", ".inf"), ("weight_decay", ".inf"), ("min_lr", ".nan")):
        path.write_text(f"name: s\nmodels:\n  - preset: tiny-rla\nbase:\n  train:\n    {key}: {value}\n")
        with pytest.raises(UserError, match=rf"s.yaml:6: base.train.{key}: Input should be a finite number"):
            load_sweep(path)
    with pytest.raises(pydantic.ValidationError, match="finite number"):
        TrainConfig(adam_eps=float("inf"))
    with pytest.raises(pydantic.ValidationError, match="finite number"):
        MQARData.model_validate({"kind": "mqar", "vocab_size": 64, "seq_len": 64, "num_pairs": 4,
                                 "power_a": float("nan")})


def test_an_unknown_data_kind_gets_a_did_you_mean_and_the_kinds(tmp_path):
    """A discriminated union's tag: pydantic's "Input tag 'stdlb' found using 'kind' does not match any of the
    expected tags" becomes the project's wording."""
    from rla_ablate.sweep.expand import load_sweep

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodels: [{preset: tiny-rla}]\nbase:\n  train: {tokens: 8192, batch_tokens: 512}\n"
                    "  data: {kind: stdlb}\n")
    with pytest.raises(UserError) as info:
        load_sweep(path)
    assert "base.data: unknown kind 'stdlb' (did you mean 'stdlib'?); allowed: stdlib, text," in str(info.value)


def test_a_key_in_both_grid_and_zip_is_reported_at_zip():
    from rla_ablate.sweep.schema import SweepConfig

    text = "name: x\nmodels: [{preset: a}]\ngrid: {train.lr: [1, 2]}\nzip:\n  train.lr: [1, 2]\n  train.min_lr: [0, 1]\n"
    with pytest.raises(UserError) as info:
        validate(SweepConfig, load_yaml_text(text, "s.yaml"))
    assert str(info.value) == "s.yaml:4: zip: key(s) train.lr are in both grid and zip; list each in one of them"


def test_a_misspelt_required_key_is_one_problem():
    """`hiden_size` for `hidden_size`: the unknown key with its did-you-mean, not also 'hidden_size: Field
    required' at another line."""
    import yaml as _yaml

    from rla_ablate.models import ModelConfig, load_preset

    data = load_preset("tiny-rla").model_dump(mode="json")
    data["hiden_size"] = data.pop("hidden_size")
    with pytest.raises(UserError) as info:
        validate(ModelConfig, load_yaml_text(_yaml.safe_dump(data, sort_keys=False), "m.yaml"))
    msg = str(info.value)
    assert "unknown key 'hiden_size' (did you mean 'hidden_size'?)" in msg and "Field required" not in msg, msg
    assert "problems" not in msg
    del data["hiden_size"]  # missing and not misspelt: still said
    with pytest.raises(UserError, match="hidden_size: Field required"):
        validate(ModelConfig, load_yaml_text(_yaml.safe_dump(data, sort_keys=False), "m.yaml"))


def test_a_second_yaml_document_is_named_as_such(tmp_path):
    """PyYAML's "but found another document" becomes what to do about it; a leading '---' alone is fine."""
    with pytest.raises(UserError) as info:
        load_yaml_text("name: a\nmodels: []\n---\nname: b\n", "s.yaml")
    assert str(info.value) == ("s.yaml:3: a second YAML document starts here ('---'); the file must hold one "
                               "document: remove the '---' and what follows, or split the file")
    assert load_yaml_text("---\nname: a\n", "s.yaml").data == {"name": "a"}
