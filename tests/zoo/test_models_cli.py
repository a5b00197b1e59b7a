"""`hppctl models` through the CLI entry point (exit codes, one JSON document on stdout)."""

from __future__ import annotations

import json

from hppctl.cli import run


def test_models_json(capsys):
    assert run(["models", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert isinstance(doc, list)
    by_name = {row["name"]: row for row in doc}
    assert set(doc[0]) == {"name", "task", "parameters", "layers", "input"}
    assert by_name["efficientnet-b1"]["layers"]["fine"] >= 150
    assert by_name["resnet50"] == {
        "name": "resnet50",
        "task": "train",
        "parameters": by_name["resnet50"]["parameters"],
        "layers": {"fine": 187, "block": 18},
        "input": [3, 224, 224],
    }
    assert by_name["opt-2.7b"]["task"] == "inference"


def test_models_table(capsys):
    assert run(["models"]) == 0
    captured = capsys.readouterr()
    assert "efficientnet-b1" in captured.out and "opt-2.7b" in captured.out
    assert captured.err == ""


def test_one_model_layers_json(capsys):
    assert run(["models", "tiny-cnn", "--granularity", "block", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "tiny-cnn" and doc["granularity"] == "block"
    assert [layer["name"] for layer in doc["layers"]] == ["stem", "blocks.0", "head"]


def test_one_model_layers_table(capsys):
    assert run(["models", "tiny-mlp"]) == 0
    assert "blocks.0.0" in capsys.readouterr().out


def test_unknown_model_is_bad_input(capsys):
    assert run(["models", "nope", "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["kind"] == "bad_input"  # --json: the error document on stdout
    assert captured.err.startswith("error: unknown model 'nope' (known: mobilenetv2,")
    assert captured.err.count("\n") == 1


def test_bad_granularity(capsys):
    assert run(["models", "tiny-cnn", "-g", "coarse"]) == 2
    assert "granularity" in capsys.readouterr().err
