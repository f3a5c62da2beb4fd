"""Command lines: a bad number is one argparse line naming the flag and the rule, not a traceback."""

import pytest

from txjax import bench, decoding
from txjax.cost import cli as cost_cli

CASES = [
    (cost_cli.main, ["gpt2-small", "--seq", "0"], "argument --seq: must be >= 1, got 0"),
    (cost_cli.main, ["gpt2-small", "--batch", "-2"], "argument --batch: must be >= 1, got -2"),
    (cost_cli.main, ["gpt2-small", "--bytes", "nan"], "argument --bytes: must be > 0, got nan"),
    (cost_cli.main, ["gpt2-small", "--seq", "ten"], "argument --seq: expected int, got 'ten'"),
    (bench.main, ["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (bench.main, ["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (bench.main, ["--warmup", "-1"], "argument --warmup: must be >= 0, got -1"),
    (decoding.main, ["--bench", "--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (decoding.main, ["--bench", "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
]


@pytest.mark.parametrize("main, argv, message", CASES, ids=[" ".join(a) for _, a, _ in CASES])
def test_bad_numbers_are_one_line_errors(main, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_garbled_hugging_face_config_is_one_line_naming_the_file(tmp_path):
    import subprocess
    import sys

    (tmp_path / "config.json").write_text("{garbled")
    done = subprocess.run([sys.executable, "-m", "txjax.hf", str(tmp_path), "--text", "hi"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"error: {tmp_path / 'config.json'} is not valid JSON "
                                   "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))")


@pytest.mark.parametrize("script, flag", [("train_t5", "vocab_size"), ("train_bert", "pad_id"),
                                          ("train_t5", "decoder_start_id")])
def test_a_flag_the_run_sets_from_its_tokenizer_is_refused_not_overridden(script, flag, capsys):
    from experiment_scripts import load_script

    with pytest.raises(SystemExit) as exit_info:
        load_script(script).main(["--preset", "cpu", f"--{flag}", "20"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--{flag} cannot be given here: the character tokenizer built from the corpus sets it" in err
    assert "Traceback" not in err
