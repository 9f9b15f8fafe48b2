"""scripts/export_hf.py on a training run: the Orbax checkpoints `loop.train` writes become HF directories that
transformers loads with the policy's logits; bad input exits with status 2, names the path and writes nothing; the
params are verified against their saved checksums, and a run still training is only read."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from mathrl_jax.models import hf, write_tiny_checkpoint
from mathrl_jax.train import loop
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from tests.train import loop_fixtures as loop_tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "export_hf.py")
IDS = np.array([[1, 5, 17, 42, 3, 9, 60, 2]], np.int64)


def small_config(model_dir, run_dir):
    # The loop tests' tiny run, saving every iteration so that there are two steps to export.
    return loop_tests.small_config(model_dir, run_dir, num_iterations=2, save_interval=1, export_final=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    model_dir = str(root / "model")
    write_tiny_checkpoint(model_dir, seed=0, num_hidden_layers=1)
    run_dir = root / "run"
    summary = loop.train(small_config(model_dir, run_dir), reward_fn=loop_tests.first_char_reward)
    return {"root": root, "model_dir": model_dir, "run_dir": str(run_dir), "state": summary["state"]}


def start_export(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.Popen(
        [sys.executable, SCRIPT, *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process):
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def export(*args):
    return finish(start_export(*args))


def load_script():
    spec = importlib.util.spec_from_file_location("export_hf_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def jax_logits(model_dir, params):
    graphdef, _ = nnx.split(hf.load_model(model_dir))
    model = nnx.merge(graphdef, params)
    return np.asarray(model(jnp.asarray(IDS), attention_mask=jnp.ones(IDS.shape, jnp.int32))[0])


def torch_logits(out):
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.from_numpy(IDS), attention_mask=torch.ones(IDS.shape, dtype=torch.int64)).logits.numpy()


def test_exports_of_the_latest_and_of_one_step_give_the_checkpoints_logits(trained, capsys):
    run_dir, model_dir = trained["run_dir"], trained["model_dir"]
    latest, first = trained["root"] / "latest", trained["root"] / "step1"

    # The command line, as a user runs it (both at once: they only read the run).
    processes = [
        start_export(run_dir, "--out", latest),
        start_export(os.path.join(run_dir, "checkpoints", "1"), "--out", first),
    ]
    done_latest, done_first = map(finish, processes)
    assert done_latest.returncode == 0, done_latest.stderr[-3000:]
    assert done_first.returncode == 0, done_first.stderr[-3000:]
    assert os.path.join("checkpoints", "2") in done_latest.stdout
    assert not [name for name in os.listdir(trained["root"]) if name.startswith(".")], "a temporary dir was left"

    # Step 2 is the state the run ended with; step 1 is read back by the training code's own Checkpointer.
    state = trained["state"]
    with Checkpointer(os.path.join(run_dir, "checkpoints"), save_interval=0) as checkpointer:
        step1_state, metadata = checkpointer.restore(state, step=1)
    assert metadata["iteration"] == 1
    expected_latest = jax_logits(model_dir, state.params)
    expected_first = jax_logits(model_dir, step1_state.params)

    got_latest, got_first = torch_logits(str(latest)), torch_logits(str(first))
    np.testing.assert_allclose(got_latest, expected_latest, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_first, expected_first, rtol=1e-4, atol=1e-4)
    assert np.abs(got_latest - got_first).max() > 1e-3, "the step 1 and step 2 exports are the same model"
    base = jax_logits(model_dir, nnx.state(hf.load_model(model_dir)))
    assert np.abs(got_first - base).max() > 1e-3, "the step 1 export is the untrained model"
    assert transformers.AutoTokenizer.from_pretrained(str(latest))("1+1")["input_ids"]

    # --step picks a step of a run dir; an existing non-empty --out is replaced only with --force.
    script = load_script()
    assert script.main([run_dir, "--step", "1", "--out", str(latest)]) == 2
    err = capsys.readouterr().err
    assert str(latest) in err and "--force" in err, err
    np.testing.assert_allclose(torch_logits(str(latest)), expected_latest, rtol=1e-4, atol=1e-4)
    assert script.main([run_dir, "--step", "1", "--out", str(latest), "--force"]) == 0
    np.testing.assert_allclose(torch_logits(str(latest)), expected_first, rtol=1e-4, atol=1e-4)
    assert not [name for name in os.listdir(trained["root"]) if name.startswith(".")], "a temporary dir was left"


def bad_inputs(run_dir, tmp):
    empty_run = tmp / "empty_run"
    (empty_run / "checkpoints").mkdir(parents=True)
    not_a_run = tmp / "not_a_run"
    not_a_run.mkdir()
    return {
        "missing path": ([tmp / "nowhere"], str(tmp / "nowhere")),
        "not a run dir": ([not_a_run], str(not_a_run)),
        "no checkpoints": ([empty_run], os.path.join(str(empty_run), "checkpoints")),
        "unknown step": ([run_dir, "--step", 7], "step 7"),
        "step dir without state": ([os.path.join(run_dir, "checkpoints", "9")], "9"),
        "wrong base model": ([run_dir, "--like", tmp / "other_model"], run_dir),
    }


def test_bad_input_exits_2_names_the_path_and_writes_nothing(trained, tmp_path, capsys):
    run_dir = trained["run_dir"]
    os.makedirs(os.path.join(run_dir, "checkpoints", "9"), exist_ok=True)  # a step dir with no state item
    write_tiny_checkpoint(str(tmp_path / "other_model"), seed=0, num_hidden_layers=2)
    script = load_script()
    try:
        for case, (args, named) in bad_inputs(run_dir, tmp_path).items():
            out = tmp_path / f"out_{case.replace(' ', '_')}"
            status = script.main([*map(str, args), "--out", str(out)])
            err = capsys.readouterr().err
            assert status == 2, (case, err)
            assert named in err and len(err.strip().splitlines()) == 1, (case, err)
            assert not os.path.exists(out), case
        assert not [name for name in os.listdir(tmp_path) if name.startswith(".")], "a temporary dir was left"
    finally:
        os.rmdir(os.path.join(run_dir, "checkpoints", "9"))
    # The command line itself: exit status 2, one line naming the path, no traceback.
    done = export(tmp_path / "nowhere", "--out", tmp_path / "out")
    assert done.returncode == 2 and str(tmp_path / "nowhere") in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not os.path.exists(tmp_path / "out")


def test_base_model_is_the_one_the_run_started_from(tmp_path):
    """As build.build_run picks it: warmstart_model after a warm-start, else model_name_or_path, else initial_model."""
    script = load_script()
    run, model = tmp_path / "run", tmp_path / "model"
    (run / "warmstart_model").mkdir(parents=True)
    (run / "initial_model").mkdir()
    model.mkdir()
    config = {"model_name_or_path": str(model), "warmstart": {"steps": 5}}
    assert script.base_model_dir(str(run), config) == str(run / "warmstart_model")
    config["warmstart"]["steps"] = 0  # a warmstart_model of an earlier run with other settings is not used
    assert script.base_model_dir(str(run), config) == str(model)
    assert script.base_model_dir(str(run), {"model_name_or_path": "", "warmstart": {"steps": 0}}) == str(
        run / "initial_model"
    )
    with pytest.raises(script.InputError, match="--like"):
        script.base_model_dir(str(run), {"model_name_or_path": str(tmp_path / "moved"), "warmstart": {"steps": 0}})


def test_the_params_read_are_verified_and_a_run_still_training_is_left_alone(trained, tmp_path, capsys):
    """The trainer's restore reads the params alone (a checksum of the optimizer state that differs does not matter)
    and verifies them: one that differs exits 2 naming the step and the leaf. A save in progress (Orbax's tmp
    directory) is not taken for a crashed one and removed."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained["run_dir"], run_dir)
    in_progress = run_dir / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000"
    (in_progress / "state").mkdir(parents=True)
    checksums_file = run_dir / "checkpoints" / "2" / "checksums" / "metadata"
    saved = json.loads(checksums_file.read_text())

    def edit_a_checksum(prefix):
        edited = json.loads(json.dumps(saved))
        name = min(n for n in edited["leaves"] if n.startswith(prefix))
        edited["leaves"][name]["checksum"] = "0" * 16
        checksums_file.write_text(json.dumps(edited))
        return name

    script = load_script()
    edit_a_checksum("opt_state/")
    assert script.main([str(run_dir), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert in_progress.is_dir()
    name = edit_a_checksum("params/")
    assert script.main([str(run_dir), "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "fails verification" in err and name in err and str(run_dir / "checkpoints" / "2") in err, err
    assert len(err.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "refused")
    assert in_progress.is_dir()


@pytest.fixture(scope="module")
def params_and_like(tmp_path_factory):
    """Parameter-file mode's inputs (no training): the tiny model's params saved with flax, and its directory."""
    from flax import serialization

    root = tmp_path_factory.mktemp("params_mode")
    like = str(root / "like")
    write_tiny_checkpoint(like, seed=0, num_hidden_layers=1)
    params = root / "params.msgpack"
    params.write_bytes(serialization.msgpack_serialize(nnx.to_pure_dict(nnx.state(hf.load_model(like)))))
    return str(params), like


@pytest.mark.parametrize("unrelated", ["notes.txt", os.path.join("sub", "data.csv")])
def test_force_replaces_a_previous_export_and_refuses_a_directory_holding_anything_else(
    params_and_like, tmp_path, capsys, unrelated
):
    """`--force` replaces a previous export (every file of it, as an export writes them) but not a directory that
    holds anything else: exit 2, one line naming the directory and the unrelated file, nothing written or removed
    (Hugging Face's save_pretrained removes only its own stale shards)."""
    params, like = params_and_like
    script = load_script()
    out = tmp_path / "out"
    assert script.main(["--params", params, "--like", like, "--out", str(out)]) == 0, capsys.readouterr().err
    assert script.main(["--params", params, "--like", like, "--out", str(out), "--force"]) == 0  # a previous export
    exported = sorted(os.listdir(out))
    assert "config.json" in exported and "model.safetensors" in exported, exported
    capsys.readouterr()

    (out / unrelated).parent.mkdir(exist_ok=True)
    (out / unrelated).write_text("the user's own")
    before = sorted((p, os.path.getmtime(os.path.join(r, p))) for r, _, ps in os.walk(out) for p in ps)
    assert script.main(["--params", params, "--like", like, "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(out) in err and unrelated in err, err
    assert (out / unrelated).read_text() == "the user's own"
    assert sorted((p, os.path.getmtime(os.path.join(r, p))) for r, _, ps in os.walk(out) for p in ps) == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")], "a temporary dir was left"

    # A directory of other files only (not an export at all) is refused too; an empty one is written.
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert script.main(["--params", params, "--like", like, "--out", str(other), "--force"]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "not a previous export" in err and (other / "config.json").read_text() == "{}", err
    (tmp_path / "empty").mkdir()
    assert script.main(["--params", params, "--like", like, "--out", str(tmp_path / "empty"), "--force"]) == 0


def test_a_step_saved_before_checksums_is_exported_only_when_allowed(trained, tmp_path, capsys):
    """A step whose metadata lists no checksums (a version before they were kept) cannot be verified: exit 2,
    one line naming the step and `--allow-unverified`; with it, the export is written."""
    from tests.train.checkpoint.test_checkpoint_integrity import remove_checksums

    run_dir = tmp_path / "run"
    shutil.copytree(trained["run_dir"], run_dir)
    for step in (1, 2):  # a run saved by that version: no step has them
        remove_checksums(str(run_dir / "checkpoints"), step, from_metadata=True)
    script = load_script()
    assert script.main([str(run_dir), "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "--allow-unverified" in err and "checkpoints/2" in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "refused")
    assert script.main([str(run_dir), "--out", str(tmp_path / "out"), "--allow-unverified"]) == 0
    assert (tmp_path / "out" / "config.json").exists()
