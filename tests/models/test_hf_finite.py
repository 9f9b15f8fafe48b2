"""A Hugging Face checkpoint with a NaN or inf weight, or a NaN config value, is refused at load, naming the tensor
or key (issue 60: such a model computes no finite loss, and every update of a run was skipped)."""

import json

import ml_dtypes
import numpy as np
import pytest

from mathrl_jax.models import hf, hf_config, qwen, tiny
from mathrl_jax.models.safetensors_io import ModelCheckpointError, SafetensorsFile, write_safetensors


@pytest.mark.parametrize(
    "dtype, value",
    [(np.float32, np.nan), (np.float64, -np.inf), (np.float16, np.inf), (ml_dtypes.bfloat16, np.nan)],
)
def test_a_non_finite_value_of_any_float_dtype_is_named(tmp_path, dtype, value):
    path = str(tmp_path / "model.safetensors")
    bad = np.arange(12, dtype=np.float32).reshape(3, 4).astype(dtype)
    bad[2, 1] = value
    write_safetensors(path, {"fine": np.ones(5, np.float32), "ids": np.arange(4, dtype=np.int32), "bad": bad})
    file = SafetensorsFile(path)
    hf.check_finite_tensor(file, "fine")
    hf.check_finite_tensor(file, "ids")  # integers hold no NaN
    with pytest.raises(ModelCheckpointError, match=r"tensor 'bad' in .*model.safetensors holds 1 non-finite value"):
        hf.check_finite_tensor(file, "bad")
    with pytest.raises(ModelCheckpointError, match="tensor 'bad'"):
        hf.check_finite_checkpoint(str(tmp_path))


def test_loading_a_model_with_a_nan_weight_names_the_tensor(tmp_path):
    """Before: loaded; every loss of a run on it was NaN."""
    directory = str(tmp_path / "model")
    tiny.write_tiny_checkpoint(directory, seed=0)
    path = f"{directory}/model.safetensors"
    file = SafetensorsFile(path)
    tensors = {name: np.array(file.get(name)) for name in file.keys()}
    del file
    hf.load_model(directory)  # finite: loads
    tensors["model.norm.weight"][0] = np.nan
    write_safetensors(path, tensors)
    with pytest.raises(ModelCheckpointError, match=r"tensor 'model.norm.weight' in .* holds 1 non-finite value"):
        hf.load_model(directory)


@pytest.mark.parametrize("key, value", [("rms_norm_eps", float("nan")), ("rope_theta", float("inf"))])
def test_a_non_finite_config_value_is_named(tmp_path, key, value):
    """Before: `rms_norm_eps: NaN` loaded, and made every activation NaN."""
    directory = str(tmp_path / "model")
    tiny.write_tiny_checkpoint(directory, seed=0)
    config = json.loads(open(f"{directory}/config.json").read())
    config[key] = value
    with open(f"{directory}/config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(qwen.ConfigError, match=f"config.json has {key}={value!r}: expected a finite number"):
        hf_config.load_config(directory)
